"""Authentication as other plugins reach it: the token checker an auth plugin keeps on the
server's state while the server runs (auth-jwt implements it; the mcp service consumes it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from litestar.config.app import AppConfig
from litestar.datastructures import State

from kronk_core.contract.errors import UnavailableError

# The app.state key of the server's TokenChecker.
TOKEN_CHECKER = "kronk_token_checker"


@dataclass(frozen=True)
class Checked:
    """Who a checked token belongs to."""

    subject: str
    admin: bool


class TokenChecker(Protocol):
    """Checks a request's credentials for an endpoint."""

    async def check(self, credentials: str | None, endpoint: str, times: int = 1) -> Checked:
        """Authenticate; for a named endpoint, check its grant and charge `times` requests
        (0: only the grant). `endpoint` may be ADMIN (admin tokens only) or AUTHENTICATED
        (any valid token). Raises AuthenticationError, PermissionDeniedError, RateLimitError,
        or UnavailableError when the checker cannot answer."""
        ...

    def close(self) -> None:
        """Release stores and connections (the server is stopping)."""


class _Starting:
    """Held on the state from the app's build until the auth plugin's lifespan has said
    whether auth is on: a consumer that looks then must not take it for "off"."""


STARTING = _Starting()


def expect_token_checker(app_config: AppConfig) -> None:
    """An auth plugin announces at build time that its lifespan will provide the checker."""
    app_config.state[TOKEN_CHECKER] = STARTING


def token_checker(state: State) -> TokenChecker | None:
    """The server's token checker; None when auth is off or no auth plugin is active.

    Fails closed while the auth plugin is still starting (a consumer started too early).
    """
    found: TokenChecker | _Starting | None = state.get(TOKEN_CHECKER)
    if isinstance(found, _Starting):
        raise UnavailableError("authentication has not started yet")
    return found
