"""Hook implementations of the mcp plugin."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import click
from litestar import Litestar

from kronk_api.listen import ListenError
from kronk_core import Kronk, hookimpl
from kronk_core.errors import ConfigError
from kronk_core.sections import Section
from kronk_mcp.auth import server_gate
from kronk_mcp.cli import add_commands
from kronk_mcp.service import BackgroundService, mcp_app
from kronk_mcp.settings import SETTINGS

log = logging.getLogger(__name__)

STATE_KEY = "kronk_mcp"


@hookimpl
def kronk_settings() -> Sequence[Section[Any]]:
    return [SETTINGS]


@hookimpl(trylast=True)  # after auth-jwt has put its authenticator on app.state
def kronk_startup(kronk: Kronk, app: Litestar) -> None:
    settings = SETTINGS.of(app.state.settings)
    if settings.host:
        log.info("mcp: clients use the MCP service at %s (mcp.host)", settings.external_url)
        return
    server_settings = app.state.settings
    gate = server_gate(app.state, server_settings)
    service = BackgroundService(mcp_app(settings, gate), settings.listen, server_settings.log_level)
    try:
        service.start()
    except ListenError as exc:
        if "listen" in settings.model_fields_set:
            raise ConfigError(f"{SETTINGS.name}.listen", str(exc)) from None
        # The default address may be another Kronk's: serve the models without a service.
        log.error("mcp: no MCP service: %s; set mcp.listen or mcp.host", exc)
        return
    app.state[STATE_KEY] = service


@hookimpl(tryfirst=True)  # before auth-jwt closes its counters
def kronk_shutdown(kronk: Kronk, app: Litestar) -> None:
    service: BackgroundService | None = app.state.get(STATE_KEY)
    if service is not None:
        service.stop()


@hookimpl
def kronk_cli(group: click.Group) -> None:
    add_commands(group)
