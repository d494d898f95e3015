"""`python -m kronk`: the `kronk` command, for where the console script is not on PATH.

The code lives in kronk_core (the SDK) and kronk_api (the server and the command line).
"""
