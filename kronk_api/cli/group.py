"""The `kronk` group: the core's commands, the plugins' (added through the kronk_cli hook
the first time it lists or looks up a command), and the flags read before the plugins load."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import click

from kronk_api.bool_flags import BoolValueGroup
from kronk_api.cli.devices import devices
from kronk_api.cli.models import model
from kronk_api.cli.plugins import plugins
from kronk_api.cli.run import run
from kronk_api.cli.server import server
from kronk_api.options import cli_plugins

# `kronk server start` flags that choose llama.cpp's libraries: the llamacpp plugin binds
# libllama when it is imported, so their variables are set before the plugins load.
EARLY_VARIABLES = {"--processor": "KRONK_PROCESSOR", "--lib-path": "KRONK_LIB_PATH"}


def _set_early_variables(args: Sequence[str]) -> None:
    if list(args[:2]) != ["server", "start"]:
        return
    rest = list(args[2:])
    for position, arg in enumerate(rest):
        name, equals, value = arg.partition("=")
        if name in EARLY_VARIABLES and (equals or position + 1 < len(rest)):
            os.environ[EARLY_VARIABLES[name]] = value if equals else rest[position + 1]


class KronkGroup(BoolValueGroup):
    """Lets plugins add sub-commands through the kronk_cli hook; its sub-groups are
    BoolValueGroups (boolean flags take `=VALUE` everywhere)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plugins_added = False

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        _set_early_variables(args)
        return super().parse_args(ctx, args)

    def _add_plugin_commands(self) -> None:
        if not self._plugins_added:
            self._plugins_added = True
            cli_plugins().hook.kronk_cli(group=self)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._add_plugin_commands()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self._add_plugin_commands()
        return super().get_command(ctx, cmd_name)


@click.group(cls=KronkGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kronk")
def main() -> None:
    """Kronk: a local inference server and SDK for GGUF models."""


main.add_command(devices)
main.add_command(model)
main.add_command(plugins)
main.add_command(run)
main.add_command(server)
