"""The `kronk` command line. Every setting's flag and KRONK_* variable follow one rule.

`group` is the `kronk` group, which plugins add commands to (`kronk_cli`); `server`,
`models`, `run`, `plugins` and `devices` hold the core's commands; `serve` is the foreground
server and `process` the server's process seen from outside (pid file, log file, a detached
start); `common` and `output` are what the commands share.
"""

from kronk_api.cli.group import main

__all__ = ["main"]
