"""The MCP endpoint's token check: the model server's token checker (kronk_api.auth, which
auth-jwt provides), under the grant `mcp`."""

from __future__ import annotations

import asyncio

from litestar.datastructures import State

from kronk_api.contract import TokenChecker, token_checker

ENDPOINT = "mcp"


class ServerGate:
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


def server_gate(state: State) -> ServerGate | None:
    """The gate of a model server that has auth on (its app state), else None.

    Called on the server's loop, once the auth plugin has started: before, the token
    checker's absence is not taken for "auth off" (kronk_api.auth fails closed).
    """
    auth = token_checker(state)
    return None if auth is None else ServerGate(auth, asyncio.get_running_loop())
