"""Admin routes for `kronk security`: keys and tokens of the running server."""

from __future__ import annotations

import json
from typing import Any

from litestar import Request, Router, delete, get, post
from litestar.params import FromPath
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kronk_api.contract import ADMIN, AUTHENTICATED, ENDPOINT_OPT, TOKEN_CHECKER, TokenChecker
from kronk_auth_jwt.guard import Authenticator, StaticKey, credentials_of
from kronk_auth_jwt.settings import SETTINGS
from kronk_auth_jwt.tokens import issue, parse_duration, parse_endpoints
from kronk_core.contract import InvalidRequestError, KronkError

_ADMIN = {ENDPOINT_OPT: ADMIN}


class AuthDisabledError(KronkError):
    status = 404
    code = "auth_disabled"


class TokenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    duration: str
    endpoints: str


class CheckRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    endpoint: str = Field(min_length=1)
    # Requests to charge: an MCP call charges one per tool call, a session's opening none.
    times: int = Field(default=1, ge=0, le=1000)


def _checker(request: Request[Any, Any, Any]) -> TokenChecker:
    settings = SETTINGS.of(request.app.state.settings)
    if not settings.enabled:
        raise AuthDisabledError("authentication is not enabled on this server")
    checker: TokenChecker = request.app.state[TOKEN_CHECKER]
    return checker


def _auth(request: Request[Any, Any, Any]) -> Authenticator:
    checker: TokenChecker | None = _checker(request)
    if isinstance(checker, StaticKey):  # keys and tokens are the JWT checker's
        checker = checker.tokens
    if not isinstance(checker, Authenticator):
        host = SETTINGS.of(request.app.state.settings).host
        raise InvalidRequestError(
            f"this server's tokens are checked by the auth service at {host}: "
            "manage keys and tokens there"
        )
    return checker


# Any valid token passes the guard (a bad one is a 401 before the body is read); what the
# route answers is that token's check for the endpoint named (the auth service of
# auth-jwt.host).
@post("/v1/kronk/security/authenticate", opt={ENDPOINT_OPT: AUTHENTICATED}, status_code=200)
async def authenticate(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Check the caller's token for an endpoint, as a remote authenticator asks: its subject
    and whether it is an admin, or the error the endpoint would answer."""
    checker = _checker(request)
    credentials = credentials_of(request)
    try:
        body = CheckRequest.model_validate(json.loads(await request.body()))
    except (ValueError, ValidationError):
        raise InvalidRequestError('expected {"endpoint": "chat-completions", "times": 1}') from None
    checked = await checker.check(credentials, body.endpoint, body.times)
    return {"subject": checked.subject, "admin": checked.admin}


@get("/v1/kronk/security/keys", opt=_ADMIN)
async def list_keys(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The signing keys (admin)."""
    return {"object": "list", "data": [info.as_dict() for info in _auth(request).keys.list()]}


@post("/v1/kronk/security/keys", opt=_ADMIN, status_code=201)
async def create_key(request: Request[Any, Any, Any]) -> dict[str, str]:
    """Add a signing key (admin)."""
    return _auth(request).keys.create().as_dict()


@delete("/v1/kronk/security/keys/{key_id:str}", opt=_ADMIN, status_code=200)
async def delete_key(request: Request[Any, Any, Any], key_id: FromPath[str]) -> dict[str, Any]:
    """Remove a signing key (admin)."""
    _auth(request).keys.delete(key_id)
    return {"id": key_id, "deleted": True}


@post("/v1/kronk/security/tokens", opt=_ADMIN, status_code=201)
async def create_token(request: Request[Any, Any, Any]) -> dict[str, str]:
    """Issue a token: its lifetime and the endpoints it may call, with their limits (admin)."""
    auth = _auth(request)
    try:
        body = TokenRequest.model_validate(json.loads(await request.body()))
    except (ValueError, ValidationError):
        raise InvalidRequestError(
            'expected {"duration": "720h", "endpoints": "chat-completions:1000/day,..."}'
        ) from None
    token = issue(
        auth.keys, auth.issuer, parse_duration(body.duration), parse_endpoints(body.endpoints)
    )
    return {"token": token}


def router() -> Router:
    return Router(
        path="/", route_handlers=[list_keys, create_key, delete_key, create_token, authenticate]
    )
