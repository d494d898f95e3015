"""The guard on every route: bearer token → key → signature → expiry → issuer → grant → quota."""

from __future__ import annotations

import hmac
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from kronk_api.contract import (
    ADMIN,
    AUTHENTICATED,
    ENDPOINT_OPT,
    PUBLIC,
    SUBJECT_STATE,
    TOKEN_CHECKER,
    Checked,
    TokenChecker,
)
from kronk_auth_jwt.keys import KeyStore
from kronk_auth_jwt.limits import LimitStore
from kronk_auth_jwt.settings import SETTINGS
from kronk_auth_jwt.tokens import Claims, Grant, verify
from kronk_auth_jwt.windows import window_bounds
from kronk_core.contract import AuthenticationError, PermissionDeniedError, RateLimitError


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Authenticator:
    """One server's auth state (kept on `app.state`): its keys, issuer and counters.

    `clock` says which rate-limit window a request falls in.
    """

    keys: KeyStore
    issuer: str
    store: LimitStore
    clock: Callable[[], datetime] = utc_now

    def authenticate(self, authorization: str | None) -> Claims:
        scheme, _, token = (authorization or "").partition(" ")
        if not authorization:
            raise AuthenticationError("missing bearer token (Authorization: Bearer <token>)")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthenticationError("malformed Authorization header; expected Bearer <token>")
        return verify(token.strip(), self.keys, self.issuer)

    def grant(self, claims: Claims, endpoint: str) -> Grant:
        """The grant `claims` hold for the endpoint named `endpoint`, or PermissionDeniedError.

        Admin tokens are granted every endpoint, unlimited.
        """
        if claims.admin:
            return Grant()
        grant = claims.endpoints.get(endpoint)
        if grant is None:
            raise PermissionDeniedError(f"token does not grant the {endpoint!r} endpoint")
        return grant

    async def check(self, credentials: str | None, endpoint: str, times: int = 1) -> Checked:
        claims = self.authenticate(credentials)
        checked = Checked(claims.subject, claims.admin)
        if claims.admin or endpoint == AUTHENTICATED:
            return checked
        if endpoint == ADMIN:
            raise PermissionDeniedError("this endpoint needs an admin token")
        grant = self.grant(claims, endpoint)
        for _ in range(times):
            await self.charge(claims.subject, endpoint, grant)
        return checked

    def close(self) -> None:
        self.store.close()

    async def charge(self, subject: str, endpoint: str, grant: Grant) -> None:
        """Count one request against the grant's quota, or raise RateLimitError."""
        if grant.limit is None or grant.window is None:
            return
        now = self.clock()
        start, end = window_bounds(grant.window, now)
        key = f"{subject}:{endpoint}:{grant.window}:{start.date().isoformat()}"
        if not await self.store.acquire(key, grant.limit, end.timestamp()):
            retry_after = max(1, math.ceil((end - now).total_seconds()))
            raise RateLimitError(
                f"quota of {grant.limit} {endpoint} requests per {grant.window} used up",
                retry_after=retry_after,
            )


@dataclass
class StaticKey:
    """`api_key`: one secret for a single-user server. The key grants everything (an admin);
    anything else goes to the JWT checker when auth is enabled too, else is refused."""

    key: str
    tokens: TokenChecker | None = None

    async def check(self, credentials: str | None, endpoint: str, times: int = 1) -> Checked:
        scheme, _, given = (credentials or "").partition(" ")
        # Constant time: how much of a guess matches must not show in the answer's timing.
        if scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), self.key.encode()
        ):
            return Checked("api-key", admin=True)
        if self.tokens is not None:
            return await self.tokens.check(credentials, endpoint, times)
        if not credentials:
            raise AuthenticationError(
                "missing API key (Authorization: Bearer <key>, or the x-api-key header)"
            )
        raise AuthenticationError("invalid API key")

    def close(self) -> None:
        if self.tokens is not None:
            self.tokens.close()


def credentials_of(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    """The Authorization header; Anthropic's clients send the token as x-api-key instead."""
    authorization = connection.headers.get("authorization")
    api_key = connection.headers.get("x-api-key")
    if authorization is None and api_key:
        return f"Bearer {api_key}"
    return authorization


async def authorize(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    """Litestar guard. Does nothing unless the server runs with auth-jwt.enabled or an
    api_key."""
    settings = SETTINGS.of(connection.app.state.settings)
    if (
        not (settings.enabled or settings.api_key is not None)
        or connection.scope.get("method") == "OPTIONS"
    ):
        return  # OPTIONS: CORS preflights never carry credentials
    endpoint = handler.opt.get(ENDPOINT_OPT, ADMIN)
    if endpoint == PUBLIC:
        return
    checker: TokenChecker = connection.app.state[TOKEN_CHECKER]
    checked = await checker.check(credentials_of(connection), endpoint)
    connection.state[SUBJECT_STATE] = checked.subject
