"""Tokens: RS256 JWTs with kid, iss, sub, exp and the endpoints they grant."""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import jwt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kronk_auth_jwt.keys import ADMIN_TOKEN_LIFETIME, MASTER, KeyStore
from kronk_core.contract import AuthenticationError, InvalidRequestError

ALGORITHM = "RS256"
Window = Literal["day", "month", "year"]
WINDOWS: tuple[Window, ...] = ("day", "month", "year")
_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")
_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0}
# How far in the future `nbf` and `iat` may lie: the clocks of servers that share a key
# directory differ a little, and a token is used the moment another server issued it.
CLOCK_SKEW_SECONDS = 60
# Bounds on what a token may carry: this plugin's own are far below them (a subject is a
# UUID), and the subject keys the rate-limit counters, so an outsized one must not reach
# the limit store; nor an outsized token the JWT parser.
MAX_TOKEN_CHARS = 8192
MAX_SUBJECT_CHARS = 256


@dataclass(frozen=True)
class Grant:
    """Access to one endpoint: unlimited (limit None) or `limit` requests per window."""

    limit: int | None = None
    window: Window | None = None


@dataclass(frozen=True)
class Claims:
    subject: str
    admin: bool
    endpoints: dict[str, Grant]


# Strict: a claim of the wrong JSON type (`"exp": "9999999999"`, `"admin": "yes"`) is refused,
# not converted.
_STRICT = ConfigDict(strict=True, allow_inf_nan=False)
NumericDate = int | float


class _GrantClaim(BaseModel):
    model_config = _STRICT

    limit: int = 0
    window: Literal["day", "month", "year", "unlimited"] = "unlimited"


class _TokenClaims(BaseModel):
    model_config = _STRICT

    sub: Annotated[str, Field(min_length=1)]
    exp: NumericDate
    iat: NumericDate | None = None
    nbf: NumericDate | None = None
    admin: bool = False
    endpoints: dict[str, _GrantClaim] = {}


def parse_endpoints(spec: str) -> dict[str, Grant]:
    """`"chat-completions:1000/day,embeddings:unlimited,rerank"` → grants by endpoint."""
    grants: dict[str, Grant] = {}
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, _, rule = item.partition(":")
        if not _NAME.fullmatch(name):
            raise InvalidRequestError(f"endpoints: {name!r} is not an endpoint name")
        grants[name] = _parse_rule(name, rule.strip())
    if not grants:
        raise InvalidRequestError("endpoints: name at least one endpoint")
    return grants


def _parse_rule(name: str, rule: str) -> Grant:
    if rule in ("", "unlimited"):
        return Grant()
    count, _, window_name = rule.partition("/")
    window = next((window for window in WINDOWS if window == window_name), None)
    if not count.isdigit() or int(count) < 1 or window is None:
        raise InvalidRequestError(
            f"endpoints: {name}:{rule} must be NAME, NAME:unlimited or NAME:COUNT/WINDOW "
            f"with COUNT >= 1 and WINDOW one of day, month, year"
        )
    return Grant(limit=int(count), window=window)


def parse_duration(text: str) -> timedelta:
    """Go-style durations: `720h`, `1h30m`, `90s`."""
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise InvalidRequestError(f"duration: {text!r} is not a duration like 720h or 1h30m")
    seconds = sum(float(number) * _SECONDS[unit] for number, unit in parts)
    if seconds <= 0:
        raise InvalidRequestError("duration: must be positive")
    return timedelta(seconds=seconds)


def _grant_claims(endpoints: dict[str, Grant]) -> dict[str, dict[str, Any]]:
    return {
        name: {"limit": 0, "window": "unlimited"}
        if grant.limit is None
        else {"limit": grant.limit, "window": grant.window}
        for name, grant in endpoints.items()
    }


def issue(
    keys: KeyStore,
    issuer: str,
    duration: timedelta,
    endpoints: dict[str, Grant],
    *,
    admin: bool = False,
    key_id: str | None = None,
) -> str:
    """Sign a token with `key_id`, by default the newest signing key (the master for admins)."""
    key_id = key_id or (MASTER if admin else keys.signing_key_id())
    now = int(time.time())
    claims = {
        "iss": issuer,
        "sub": str(uuid.uuid4()),
        "iat": now,
        "exp": now + int(duration.total_seconds()),
        "admin": admin,
        "endpoints": _grant_claims(endpoints),
    }
    return jwt.encode(
        claims, keys.private_key(key_id), algorithm=ALGORITHM, headers={"kid": key_id}
    )


def issue_admin_token(keys: KeyStore, issuer: str) -> str:
    return issue(keys, issuer, ADMIN_TOKEN_LIFETIME, {}, admin=True)


def verify(token: str, keys: KeyStore, issuer: str) -> Claims:
    """Check in order: well-formed, RS256, known key, signature, claims, issuer, admin's key.

    Only the header's `alg` and `kid` are read: `jku`, `jwk`, `x5u` and the like never
    choose the key.
    """
    if len(token) > MAX_TOKEN_CHARS:
        raise AuthenticationError(f"bearer token is longer than {MAX_TOKEN_CHARS} characters")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:  # not a JWT, or a header PyJWT refuses (`kid` not a string, `crit`)
        raise AuthenticationError("malformed bearer token") from None
    if header.get("alg") != ALGORITHM:
        raise AuthenticationError(f"token algorithm must be {ALGORITHM}")
    key_id = header.get("kid")
    key = keys.public_key(key_id) if isinstance(key_id, str) else None
    if key is None:
        raise AuthenticationError("token is signed by an unknown or deleted key")
    try:
        payload = jwt.decode(
            token,
            key,
            algorithms=[ALGORITHM],
            issuer=issuer,
            # nbf and iat are checked below, with the clock skew allowed.
            options={"require": ["exp", "iss", "sub"], "verify_nbf": False, "verify_iat": False},
        )
    except jwt.InvalidSignatureError:
        raise AuthenticationError("token signature does not verify") from None
    except jwt.ExpiredSignatureError:
        raise AuthenticationError("token has expired") from None
    except jwt.InvalidIssuerError:
        raise AuthenticationError("token was issued by someone else") from None
    except jwt.MissingRequiredClaimError as exc:
        raise AuthenticationError(f"token has no {exc.claim!r} claim") from None
    except jwt.PyJWTError:
        raise AuthenticationError("invalid bearer token") from None
    subject = payload.get("sub")
    if isinstance(subject, str) and len(subject) > MAX_SUBJECT_CHARS:
        raise AuthenticationError(
            f"token subject (sub) is longer than {MAX_SUBJECT_CHARS} characters"
        )
    try:
        claims = _TokenClaims.model_validate(payload)
    except ValidationError:
        raise AuthenticationError("token claims are malformed") from None
    latest = time.time() + CLOCK_SKEW_SECONDS
    for name, value in (("nbf", claims.nbf), ("iat", claims.iat)):
        if value is not None and value > latest:
            raise AuthenticationError(f"token is not valid yet ({name} is in the future)")
    if claims.admin and key_id != MASTER:
        raise AuthenticationError("admin tokens must be signed by the master key")
    return Claims(
        subject=claims.sub,
        admin=claims.admin,
        endpoints={
            name: Grant() if grant.window == "unlimited" else Grant(grant.limit, grant.window)
            for name, grant in claims.endpoints.items()
        },
    )


def open_key_store(directory: Path, issuer: str) -> KeyStore:
    """The key directory, ready: on first use it gets its keys and the admin token `master.jwt`."""
    keys = KeyStore(directory)
    if keys.ensure() or not keys.admin_token_path.exists():
        keys.write_admin_token(issue_admin_token(keys, issuer))
    return keys
