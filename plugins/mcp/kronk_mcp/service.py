"""The MCP service: the official SDK's Streamable HTTP transport with Kronk's tools, on uvicorn.

One service serves any number of sessions: the 2025 protocol revisions open
one with `initialize` (the `Mcp-Session-Id` header), the 2026 revision needs
none. It answers at `/` (the URL the manual gives clients) and at `/mcp`
(the SDK's default path).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import mcp_types as types
import uvicorn
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Route
from starlette.types import ASGIApp

from kronk_api.contract import listen
from kronk_core import __version__
from kronk_mcp import web_search
from kronk_mcp.access import Addresses, AddressGuard, Gate, TokenGuard
from kronk_mcp.brave import BraveSearch
from kronk_mcp.settings import McpSettings, split_host_port

log = logging.getLogger(__name__)

# How long open streams (a client's GET) may hold up a stop before they are cut.
GRACEFUL_STOP_SECONDS = 3
START_TIMEOUT_SECONDS = 30.0


@dataclass
class Tools:
    """What the tool handlers use while the service runs (its lifespan state)."""

    brave: BraveSearch | None


def _mcp_server(settings: McpSettings) -> Server[Tools]:
    @contextlib.asynccontextmanager
    async def lifespan(_: Server[Tools]) -> AsyncIterator[Tools]:
        key = settings.api_key
        if key is None:
            # An optional service nobody asked for: no warning at every start.
            log.debug("mcp: no Brave Search API key; web_search answers with how to set one")
            yield Tools(brave=None)
            return
        async with httpx.AsyncClient(timeout=None) as client:
            yield Tools(BraveSearch(key, settings.brave_url, settings.brave_timeout, client))

    async def list_tools(
        ctx: ServerRequestContext[Tools], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[web_search.TOOL])

    async def call_tool(
        ctx: ServerRequestContext[Tools], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if params.name != web_search.NAME:
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"unknown tool {params.name!r}; this service has {web_search.NAME}",
            )
        return await web_search.run(params.arguments or {}, ctx.lifespan_context.brave)

    return Server(
        "kronk",
        version=__version__,
        instructions="Kronk's tools: web_search searches the web with Brave Search.",
        lifespan=lifespan,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def mcp_app(settings: McpSettings, gate: Gate | None) -> ASGIApp:
    """The whole service as one ASGI app (its lifespan runs the sessions)."""
    sessions = StreamableHTTPSessionManager(
        app=_mcp_server(settings),
        # Host and Origin are checked in front, by AddressGuard, with errors that name the setting.
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    transport = StreamableHTTPASGIApp(sessions)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with sessions.run():
            yield

    app: ASGIApp = Starlette(
        routes=[Route("/", endpoint=transport), Route("/mcp", endpoint=transport)],
        lifespan=lifespan,
    )
    if gate is not None:
        app = TokenGuard(app, gate)
    # Browser clients (the MCP Inspector) need CORS answers, refusals included; preflights
    # are answered here, without a token. Only origins AddressGuard lets in get this far,
    # so each one is allowed back by name.
    app = CORSMiddleware(
        app,
        allow_origin_regex=".*",
        allow_methods=["GET", "POST", "DELETE"],
        allow_headers=["*"],
        expose_headers=[MCP_SESSION_ID_HEADER, "Retry-After", "WWW-Authenticate"],
    )
    host, _ = split_host_port(settings.listen)
    return AddressGuard(app, Addresses(host, settings.allowed_hosts, settings.allowed_origins))


def _bind(address: str) -> socket.socket:
    return listen(*split_host_port(address))


def _uvicorn(app: ASGIApp, log_level: str) -> uvicorn.Server:
    # log_config=None: uvicorn's loggers propagate to whatever the process configured.
    config = uvicorn.Config(
        app,
        log_config=None,
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_STOP_SECONDS,
    )
    return uvicorn.Server(config)


def _address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class BackgroundService:
    """The service on its own uvicorn, thread and event loop, next to the model server."""

    def __init__(self, app: ASGIApp, listen: str, log_level: str = "warning") -> None:
        self._app = app
        self._listen = listen
        self._log_level = log_level
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.address = ""

    def start(self) -> None:
        """Listen and serve; ListenError when the address is taken, RuntimeError if it dies."""
        sock = _bind(self._listen)
        self.address = _address(sock)
        server = _uvicorn(self._app, self._log_level)
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="kronk-mcp", daemon=True
        )
        self._server, self._thread = server, thread
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not server.started:
            thread.join(timeout=0.02)
            if not thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                sock.close()
                raise RuntimeError(f"the MCP service on {self.address} did not start")
        log.debug("mcp: serving MCP (Streamable HTTP) on http://%s", self.address)

    def stop(self) -> None:
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout=GRACEFUL_STOP_SECONDS + 5)
        self._server = self._thread = None


def serve_foreground(app: ASGIApp, listen: str, log_level: str) -> None:
    """`kronk mcp start`: serve until SIGINT or SIGTERM."""
    sock = _bind(listen)
    log.info("mcp: serving MCP (Streamable HTTP) on http://%s", _address(sock))
    # After a graceful stop uvicorn raises the signal again; Ctrl-C then ends quietly,
    # as it does for `kronk server start` (uvicorn.run).
    with contextlib.suppress(KeyboardInterrupt):
        _uvicorn(app, log_level).run(sockets=[sock])
