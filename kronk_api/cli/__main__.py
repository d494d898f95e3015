"""`python -m kronk_api.cli ...`: the `kronk` command (how a detached server starts)."""

from kronk_api.cli import main

main()
