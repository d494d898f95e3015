"""Serving with authentication on (the auth-jwt plugin), for tests of routes behind its
tokens: `serving_with_auth(kronk)` runs the app the plugins compose for `kronk` with auth on,
and gives the admin token auth-jwt made at its first start; `mint` makes a user token for
some endpoints, `bearer` the header that carries one."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kronk_testing.server import serving

if TYPE_CHECKING:
    from litestar import Litestar

    from kronk_core import Kronk


@dataclass
class AuthServer:
    """A served Kronk with auth on: where it listens, its base path (auth-jwt's keys are
    under it), the admin token and the app."""

    base_url: str
    base: Path
    admin: str
    app: Litestar

    @property
    def api_host(self) -> str:
        """`host:port`, as `--api-host` and KRONK_API_HOST take it."""
        return self.base_url.removeprefix("http://")


def admin_token(base: Path) -> str:
    """The master key's admin token, which auth-jwt writes under the base path
    (`keys/master.jwt`) when it starts without keys."""
    return (base / "keys" / "master.jwt").read_text().strip()


def bearer(token: str) -> dict[str, str]:
    """The Authorization header that carries `token`."""
    return {"Authorization": f"Bearer {token}"}


@contextmanager
def serving_with_auth(
    kronk: Kronk, auth: Mapping[str, Any] | None = None, **settings: Any
) -> Iterator[AuthServer]:
    """`with serving_with_auth(kronk) as server:` the app for `kronk` with auth-jwt on, its
    keys under the Kronk's base path, on a real uvicorn (kronk_testing.server.serving, whose
    shutdown closes `kronk`). `auth` are other settings of the auth-jwt section
    (`limit_store`, ...), `settings` other ServerSettings fields."""
    from kronk_api import ServerSettings, create_app

    base = kronk.config.base_path
    section = {"enabled": True, **(auth or {})}
    server = ServerSettings(base_path=base, sections={"auth-jwt": section}, **settings)
    app = create_app(server, kronk=kronk)
    with serving(app) as base_url:
        yield AuthServer(base_url=base_url, base=base, admin=admin_token(base), app=app)


def mint(server: AuthServer, endpoints: str, duration: str = "1h") -> str:
    """A user token from the server's admin route, for `endpoints` (auth-jwt's form:
    `chat-completions,embeddings`, each with an optional `:10/day` rate)."""
    import httpx

    response = httpx.post(
        f"{server.base_url}/v1/kronk/security/tokens",
        json={"duration": duration, "endpoints": endpoints},
        headers=bearer(server.admin),
    )
    assert response.status_code == 201, response.text
    token: str = response.json()["token"]
    return token
