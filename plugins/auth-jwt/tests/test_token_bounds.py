"""Outsized tokens on a server run as `kronk server start` runs it: headers past
max_header_bytes are a JSON 400 from the server's HTTP protocol (before, a 100 KB `sub`
reset the connection), and a token or subject past auth-jwt's bounds is a 401 naming it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
import pytest

from kronk_api import ServerSettings, create_app
from kronk_api.connections import ConnectionGuard
from kronk_auth_jwt.keys import KeyStore
from kronk_auth_jwt.tokens import MAX_SUBJECT_CHARS, MAX_TOKEN_CHARS
from kronk_core import Kronk, KronkConfig
from kronk_testing.auth import bearer
from kronk_testing.server import serving

MODELS = "/v1/models"  # any valid token may list them; nothing loads


@dataclass
class Guarded:
    base_url: str
    keys: KeyStore

    def token(self, **claims: Any) -> str:
        """A token signed with the server's signing key: genuine, whatever it claims."""
        kid = self.keys.signing_key_id()
        now = int(time.time())
        payload = {
            "iss": "kronk",
            "sub": str(uuid.uuid4()),
            "iat": now,
            "exp": now + 3600,
            "admin": False,
            "endpoints": {},
            **claims,
        }
        return jwt.encode(
            payload, self.keys.private_key(kid), algorithm="RS256", headers={"kid": kid}
        )

    def models(self, token: str) -> httpx.Response:
        return httpx.get(f"{self.base_url}{MODELS}", headers=bearer(token), timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    base = tmp_path_factory.mktemp("token-bounds")
    settings = ServerSettings(base_path=base, sections={"auth-jwt": {"enabled": True}})
    app = create_app(settings, kronk=Kronk(KronkConfig(base_path=base)))
    guard = ConnectionGuard(
        settings.read_header_timeout,
        settings.max_connections_per_client,
        settings.max_header_bytes,
    )
    with serving(app, **guard.uvicorn_options()) as base_url:
        yield Guarded(base_url, KeyStore(base / "keys"))


def _error(response: httpx.Response) -> dict[str, Any]:
    assert "Traceback" not in response.text
    error: dict[str, Any] = response.json()["error"]
    return error


def test_a_token_within_the_bounds_is_accepted(server: Guarded) -> None:
    assert server.models(server.token(sub="s" * MAX_SUBJECT_CHARS)).status_code == 200


def test_a_100_kb_subject_is_a_json_400_naming_max_header_bytes(server: Guarded) -> None:
    response = server.models(server.token(sub="s" * 100_000))
    assert response.status_code == 400
    error = _error(response)
    assert error["code"] == "limit_exceeded"
    assert "max_header_bytes" in error["message"]


def test_an_outsized_subject_is_401(server: Guarded) -> None:
    response = server.models(server.token(sub="s" * (MAX_SUBJECT_CHARS + 1)))
    assert response.status_code == 401
    assert error_message(response) == (
        f"token subject (sub) is longer than {MAX_SUBJECT_CHARS} characters"
    )


def test_an_outsized_token_is_401(server: Guarded) -> None:
    grants = {f"endpoint-{n}": {"limit": 0, "window": "unlimited"} for n in range(300)}
    token = server.token(endpoints=grants)
    assert MAX_TOKEN_CHARS < len(token) < ServerSettings().max_header_bytes
    response = server.models(token)
    assert response.status_code == 401
    assert error_message(response) == f"bearer token is longer than {MAX_TOKEN_CHARS} characters"


def error_message(response: httpx.Response) -> str:
    message: str = _error(response)["message"]
    return message
