"""Hook implementations of the mcp plugin."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import click
from litestar import Litestar
from litestar.config.app import AppConfig

from kronk_api.contract import ListenError, announce
from kronk_core import hookimpl
from kronk_core.contract import ConfigError, Section, Sectioned, ServerTool
from kronk_mcp.auth import server_gate
from kronk_mcp.cli import add_commands
from kronk_mcp.settings import SETTINGS

if TYPE_CHECKING:
    from kronk_mcp.service import BackgroundService

log = logging.getLogger(__name__)

STATE_KEY = "kronk_mcp"


@hookimpl
def kronk_settings() -> Sequence[Section[Any]]:
    return [SETTINGS]


# Last: its lifespan starts after auth-jwt's has put the token checker on app.state, and
# stops before auth-jwt closes its counters.
@hookimpl(trylast=True)
def kronk_app(app_config: AppConfig) -> None:
    app_config.lifespan.append(mcp_service)


@asynccontextmanager
async def mcp_service(app: Litestar) -> AsyncIterator[None]:
    service = _start(app)
    try:
        yield
    finally:
        if service is not None:
            service.stop()


def _start(app: Litestar) -> BackgroundService | None:
    """The MCP service, unless another one serves (mcp.host) or its address is taken."""
    # The MCP SDK is imported when a service starts, not with the plugin: every `kronk`
    # command loads the plugin, and the SDK takes most of a second to import.
    from kronk_mcp.service import BackgroundService, mcp_app

    settings = SETTINGS.of(app.state.settings)
    if settings.host:
        announce(app, "MCP (mcp.host)", settings.external_url)
        return None
    server_settings = app.state.settings
    gate = server_gate(app.state)
    service = BackgroundService(mcp_app(settings, gate), settings.listen, server_settings.log_level)
    try:
        service.start()
    except ListenError as exc:
        if "listen" in settings.model_fields_set:
            raise ConfigError(f"{SETTINGS.name}.listen", str(exc)) from None
        # The default address may be another Kronk's: serve the models without a service.
        log.error("mcp: no MCP service: %s; set mcp.listen or mcp.host", exc)
        return None
    app.state[STATE_KEY] = service
    announce(app, "MCP", f"http://{service.address}")
    return service


@hookimpl
def kronk_server_tools(settings: Sectioned) -> Sequence[ServerTool]:
    """web_search for agents' built-in web search, once there is a key to search with."""
    mcp = SETTINGS.of(settings)
    key = mcp.api_key
    if key is None:
        return []
    from kronk_mcp.server_tool import WebSearchTool  # the SDK's types: as in _start

    return [WebSearchTool(mcp, key)]


@hookimpl
def kronk_cli(group: click.Group) -> None:
    add_commands(group)
