"""`kronk mcp start`: the MCP service on its own, without the model server."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from kronk_api.contract import (
    BoolValueGroup,
    ListenError,
    ServerStartCommand,
    Setting,
    all_settings,
    bind_sections,
    cli_plugins,
    config_file_option,
    configure_logging,
    env_name,
    load_settings,
    server_sections,
)
from kronk_core.contract import KronkError
from kronk_mcp.settings import LOOPBACK, SETTINGS, STANDALONE_ENVIRONMENT, split_host_port

log = logging.getLogger(__name__)

# mcp.host names an external service: it means nothing to the service itself.
STANDALONE_KEYS = (
    "log_level",
    *(f"{SETTINGS.name}.{name}" for name in SETTINGS.schema.model_fields if name != "host"),
)


class StandaloneCommand(ServerStartCommand):
    """Flags and KRONK_* variables for the service's own settings only."""

    @functools.cached_property
    def schema(self) -> list[Setting]:
        return [setting for setting in all_settings([SETTINGS]) if setting.key in STANDALONE_KEYS]


def standalone_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ`, with the manual's MCP_MCP_* variables read as the KRONK_MCP_* ones (they win)."""
    manual = {
        env_name(key): environ[variable]
        for variable, key in STANDALONE_ENVIRONMENT.items()
        if variable in environ
    }
    return {**environ, **manual}


@click.group("mcp", cls=BoolValueGroup)
def mcp() -> None:
    """The MCP service (the web_search tool) on its own."""


@mcp.command("start", cls=StandaloneCommand)
@config_file_option
@click.pass_context
def start(ctx: click.Context, /, config_file: Path | None, **_: Any) -> None:
    """Run the MCP service in the foreground, without the model server.

    It serves what the service of `kronk server start` serves, on
    mcp.listen (MCP_MCP_HOST), with the key in mcp.braveapikey
    (MCP_MCP_BRAVEAPIKEY), but checks no tokens: keep it on loopback.
    """
    command = ctx.command
    assert isinstance(command, StandaloneCommand)
    try:
        overrides = command.overrides(ctx.params, standalone_environment(os.environ))
        sections = server_sections(cli_plugins())
        settings = bind_sections(load_settings(config_file, overrides, sections), cli_plugins())
        mcp_settings = SETTINGS.of(settings)
    except KronkError as exc:
        raise click.ClickException(exc.message) from None
    configure_logging(settings.log_level)
    host = split_host_port(mcp_settings.listen)[0]
    if host not in LOOPBACK:
        log.warning("mcp: listening on %s without authentication", mcp_settings.listen)
    # Here, not at the top: the MCP SDK takes most of a second to import, and every
    # `kronk` command loads this module.
    from kronk_mcp.service import mcp_app, serve_foreground

    app = mcp_app(mcp_settings, gate=None)
    try:
        serve_foreground(app, mcp_settings.listen, settings.log_level)
    except ListenError as exc:
        raise click.ClickException(str(exc)) from None


def add_commands(group: click.Group) -> None:
    """The kronk_cli hook's work: `kronk mcp`."""
    group.add_command(mcp)
