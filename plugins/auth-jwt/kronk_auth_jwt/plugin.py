"""Hook implementations of the auth-jwt plugin."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import click
import pluggy
from litestar import Litestar
from litestar.config.app import AppConfig

from kronk_api.contract import TOKEN_CHECKER, TokenChecker, expect_token_checker
from kronk_auth_jwt import hookspecs
from kronk_auth_jwt.cli import add_commands
from kronk_auth_jwt.guard import Authenticator, StaticKey, authorize
from kronk_auth_jwt.limits import LimitStore, LimitStoreFactory
from kronk_auth_jwt.remote import RemoteAuthenticator
from kronk_auth_jwt.routes import router
from kronk_auth_jwt.settings import SETTINGS
from kronk_auth_jwt.sqlite_store import SqliteLimitStore
from kronk_auth_jwt.tokens import open_key_store
from kronk_core import hookimpl
from kronk_core.contract import ConfigError, KronkView, Register, Section


@hookimpl
def kronk_addhooks(plugin_manager: pluggy.PluginManager) -> None:
    plugin_manager.add_hookspecs(hookspecs)


@hookimpl
def kronk_settings() -> Sequence[Section[Any]]:
    return [SETTINGS]


@hookimpl
def kronk_app(app_config: AppConfig, kronk: KronkView) -> None:
    app_config.guards.append(authorize)
    app_config.route_handlers.append(router())
    expect_token_checker(app_config)

    @asynccontextmanager
    async def token_checker(app: Litestar) -> AsyncIterator[None]:
        """The token checker on app.state while the server runs: None with auth off."""
        checker = app.state[TOKEN_CHECKER] = _token_checker(kronk, app)
        if checker is None:
            yield
            return
        try:
            yield
        finally:
            checker.close()

    app_config.lifespan.append(token_checker)


def _token_checker(kronk: KronkView, app: Litestar) -> TokenChecker | None:
    settings = SETTINGS.of(app.state.settings)
    tokens = _jwt_checker(kronk, app) if settings.enabled else None
    if settings.api_key is not None:
        return StaticKey(settings.api_key.get_secret_value(), tokens)
    return tokens


def _jwt_checker(kronk: KronkView, app: Litestar) -> TokenChecker:
    settings = SETTINGS.of(app.state.settings)
    if settings.host:
        return RemoteAuthenticator(settings.host)
    base = app.state.settings.base_path.expanduser()
    keys = open_key_store(base / "keys", settings.issuer)
    scheme = settings.limit_store.partition("://")[0]
    factory = kronk.registry(hookspecs.LIMIT_STORES).get(scheme, f"{SETTINGS.name}.limit_store")
    store = factory(settings.limit_store, base)
    return Authenticator(keys=keys, issuer=settings.issuer, store=store)


def sqlite_store(url: str, base_path: Path) -> LimitStore:
    if url == "sqlite":
        return SqliteLimitStore(base_path / "limits.db")
    if url.startswith("sqlite:///"):
        return SqliteLimitStore(Path(url.removeprefix("sqlite://")))
    raise ConfigError(
        f"{SETTINGS.name}.limit_store", f"expected sqlite or sqlite:///ABSOLUTE/PATH, got {url!r}"
    )


def redis_store(url: str, base_path: Path) -> LimitStore:
    # redis is an extra: a server that counts in SQLite runs without it.
    try:
        from kronk_auth_jwt.redis_store import RedisLimitStore
    except ModuleNotFoundError as exc:
        if exc.name != "redis":
            raise
        scheme = url.partition("://")[0]  # never the URL, which may hold a password
        raise ConfigError(
            f"{SETTINGS.name}.limit_store",
            f"a {scheme}:// store needs the redis package: pip install 'kronk-auth-jwt[redis]'",
        ) from None
    return RedisLimitStore(url)


@hookimpl
def kronk_register_limit_stores(register: Register[LimitStoreFactory]) -> None:
    register("sqlite", sqlite_store)
    for scheme in ("redis", "rediss", "unix"):
        register(scheme, redis_store)


@hookimpl
def kronk_cli(group: click.Group) -> None:
    add_commands(group)
