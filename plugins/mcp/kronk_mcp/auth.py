"""The MCP endpoint's token check: the auth-jwt plugin's own, under the grant `mcp`."""

from __future__ import annotations

import asyncio

from litestar.datastructures import State

from kronk_api.settings import ServerSettings
from kronk_auth_jwt.guard import STATE_KEY, TokenChecker
from kronk_auth_jwt.settings import SETTINGS as AUTH_SETTINGS
from kronk_core.errors import ConfigError

ENDPOINT = "mcp"


class AuthJwtGate:
    """Checks tokens with the model server's token checker, on the server's event loop.

    The MCP service runs on a thread and loop of its own; the checker's counter store
    (Redis, SQLite) or its connection to the auth service belongs to the server's loop, so
    every check is handed to that loop.
    """

    def __init__(self, auth: TokenChecker, loop: asyncio.AbstractEventLoop) -> None:
        self._auth = auth
        self._loop = loop

    async def admit(self, authorization: str | None, tool_calls: int) -> str:
        check = asyncio.run_coroutine_threadsafe(self._check(authorization, tool_calls), self._loop)
        return await asyncio.wrap_future(check)

    async def _check(self, authorization: str | None, tool_calls: int) -> str:
        return (await self._auth.check(authorization, ENDPOINT, tool_calls)).subject


def server_gate(state: State, settings: ServerSettings) -> AuthJwtGate | None:
    """The gate of a model server that has auth on (its app state and settings), else None.

    Called on the server's loop, once auth-jwt has started.
    """
    auth: TokenChecker | None = state.get(STATE_KEY)
    if auth is None:
        if AUTH_SETTINGS.of(settings).enabled:
            # auth-jwt has not started: the MCP service must not open without it.
            raise ConfigError("mcp", "auth-jwt.enabled is set but its authenticator is not ready")
        return None
    return AuthJwtGate(auth, asyncio.get_running_loop())
