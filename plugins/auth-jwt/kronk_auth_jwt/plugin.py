"""Hook implementations of the auth-jwt plugin."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
from litestar import Litestar

from kronk_auth_jwt.cli import add_commands
from kronk_auth_jwt.guard import STATE_KEY, Authenticator, authorize
from kronk_auth_jwt.redis_store import RedisLimitStore
from kronk_auth_jwt.routes import router
from kronk_auth_jwt.sqlite_store import SqliteLimitStore
from kronk_auth_jwt.tokens import open_key_store
from kronk_core import Kronk, hookimpl
from kronk_core.errors import ConfigError
from kronk_core.limits import LimitStore


@hookimpl
def kronk_guards(kronk: Kronk) -> Sequence[Callable[..., Any]]:
    return [authorize]


@hookimpl
def kronk_routes(kronk: Kronk) -> Sequence[Any]:
    return [router()]


@hookimpl
def kronk_startup(kronk: Kronk, app: Litestar) -> None:
    settings = app.state.settings
    if not settings.auth_enabled:
        return
    base = settings.base_path.expanduser()
    keys = open_key_store(base / "keys", settings.auth_issuer)
    store = kronk.hook.kronk_limit_store(url=settings.auth_limit_store, base_path=base)
    if store is None:
        raise ConfigError("auth_limit_store", f"no plugin opens {settings.auth_limit_store!r}")
    app.state[STATE_KEY] = Authenticator(keys=keys, issuer=settings.auth_issuer, store=store)


@hookimpl
def kronk_shutdown(kronk: Kronk, app: Litestar) -> None:
    auth: Authenticator | None = app.state.get(STATE_KEY)
    if auth is not None:
        auth.store.close()


@hookimpl(trylast=True)
def kronk_limit_store(url: str, base_path: Path) -> LimitStore | None:
    if url == "sqlite":
        return SqliteLimitStore(base_path / "limits.db")
    if url.startswith("sqlite:///"):
        return SqliteLimitStore(Path(url.removeprefix("sqlite://")))
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisLimitStore(url)
    return None


@hookimpl
def kronk_cli(group: click.Group) -> None:
    add_commands(group)
