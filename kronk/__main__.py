"""`python -m kronk ...` runs the `kronk` command."""

from kronk_api.cli import main

main(prog_name="kronk")
