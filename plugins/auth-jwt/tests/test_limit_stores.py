"""Quota counters: SQLite across a restart, Redis across two server processes, the store hook."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import jwt
import pytest
import redis
from click.testing import CliRunner
from litestar import get
from litestar.config.app import AppConfig
from litestar.testing import TestClient

from kronk_api import ServerSettings, create_app
from kronk_api.auth import TOKEN_CHECKER
from kronk_api.cli import main
from kronk_api.endpoints import ENDPOINT_OPT
from kronk_auth_jwt.redis_store import LimitStoreUnavailable, RedisLimitStore
from kronk_core import Kronk, KronkConfig, hookimpl
from kronk_core.contract.errors import ConfigError
from kronk_llamacpp.packaged import GEMMA_MODEL_ID

if TYPE_CHECKING:
    from kronk_testing.redis_server import RedisServer
    from kronk_testing.server import Serve

MODEL = GEMMA_MODEL_ID
TOKENIZE = "/v1/tokenize"
MODEL_FILE = (
    f"models:\n  {MODEL}:\n    context_window: 512\n    n_seq_max: 1\n"
)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def local_cli(base: Path, *args: str) -> str:
    result = CliRunner().invoke(main, [*args, "--local", "--base-path", str(base)])
    assert result.exit_code == 0, result.output
    return result.output.strip()


def local_token(base: Path, endpoints: str) -> str:
    return local_cli(
        base, "security", "token", "create", "--duration", "1h", "--endpoints", endpoints
    )


async def hammer(base_urls: list[str], token: str, count: int) -> list[int]:
    """`count` concurrent tokenize requests, spread over the servers; their status codes."""
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)
    async with httpx.AsyncClient(headers=bearer(token), limits=limits, timeout=60) as client:
        responses = await asyncio.gather(
            *(
                client.post(
                    base_urls[n % len(base_urls)] + TOKENIZE,
                    json={"model": MODEL, "input": f"hi {n}"},
                )
                for n in range(count)
            )
        )
    for response in responses:
        if response.status_code == 429:
            assert int(response.headers["retry-after"]) > 0
    return [response.status_code for response in responses]


# ---- SQLite: the default store ------------------------------------------------------


@pytest.mark.model
def test_sqlite_count_survives_a_restart(tmp_path: Path, serve: Serve) -> None:
    token = local_token(tmp_path, "tokenize:3/day")

    def app() -> Any:
        kronk = Kronk(KronkConfig(base_path=tmp_path))
        settings = ServerSettings(base_path=tmp_path, sections={"auth-jwt": {"enabled": True}})
        return create_app(settings, kronk=kronk)

    with serve(app()) as base_url:
        assert asyncio.run(hammer([base_url], token, 2)) == [200, 200]
    assert (tmp_path / "limits.db").exists()
    with serve(app()) as base_url:
        assert sorted(asyncio.run(hammer([base_url], token, 3))) == [200, 429, 429]


@get("/probe/counted", opt={ENDPOINT_OPT: "probe"})
async def counted() -> dict[str, bool]:
    return {"ok": True}


class CountedRoute:
    """A limited endpoint that needs no model."""

    @hookimpl
    def kronk_app(self, app_config: AppConfig) -> None:
        app_config.route_handlers.append(counted)


def test_sqlite_store_at_a_path_of_its_own(tmp_path: Path, serve: Serve) -> None:
    counters = tmp_path / "elsewhere" / "quota.db"
    token = local_token(tmp_path, "probe:2/day")

    def app() -> Any:
        kronk = Kronk(KronkConfig(base_path=tmp_path), plugins={"counted": CountedRoute()})
        settings = ServerSettings(
            base_path=tmp_path,
            sections={"auth-jwt": {"enabled": True, "limit_store": f"sqlite://{counters}"}},
        )
        return create_app(settings, kronk=kronk)

    def probe(base_url: str) -> int:
        return httpx.get(f"{base_url}/probe/counted", headers=bearer(token)).status_code

    with serve(app()) as base_url:
        assert [probe(base_url), probe(base_url)] == [200, 200]
    assert not (tmp_path / "limits.db").exists()
    with sqlite3.connect(counters) as db:
        rows = db.execute("SELECT key, count FROM counters").fetchall()
    assert len(rows) == 1 and rows[0][1] == 2 and ":probe:day:" in rows[0][0], rows
    with serve(app()) as base_url:  # the count lives in that file, across a restart
        assert probe(base_url) == 429


# ---- Redis: several servers ------------------------------------------------------------


def test_redis_store_admits_exactly_the_limit_from_many_threads(redis_url: str) -> None:
    store = RedisLimitStore(redis_url)
    expires_at = time.time() + 60

    async def race() -> list[bool]:
        return await asyncio.gather(
            *(store.acquire("threads:probe", 10, expires_at) for _ in range(50))
        )

    try:
        assert asyncio.run(race()).count(True) == 10
        ttl = redis.Redis.from_url(redis_url).ttl("kronk:limit:threads:probe")
        assert 0 < ttl <= 61
    finally:
        store.close()


def test_an_unreachable_redis_refuses_rather_than_admits(port_finder: Callable[[], int]) -> None:
    store = RedisLimitStore(f"redis://127.0.0.1:{port_finder()}/0")  # nobody listens there
    try:
        with pytest.raises(LimitStoreUnavailable) as caught:
            asyncio.run(store.acquire("k", 10, time.time() + 60))
    finally:
        store.close()
    assert caught.value.status == 503
    assert "127.0.0.1" not in caught.value.message


@pytest.fixture
def two_servers(
    tmp_path: Path, redis_url: str, port_finder: Callable[[], int]
) -> Iterator[list[str]]:
    """Two `kronk server start` processes on one base path, sharing a Redis store."""
    local_cli(tmp_path, "security", "key", "list")  # first use creates the keys for both
    models = tmp_path / "models.yaml"
    models.write_text(MODEL_FILE)
    environment = {key: value for key, value in os.environ.items() if not key.startswith("KRONK_")}
    processes: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        for _ in range(2):
            port = port_finder()
            command = [sys.executable, "-m", "kronk_api.cli", "server", "start"]
            command += ["--api-host", f"127.0.0.1:{port}", "--base-path", str(tmp_path)]
            command += ["--model-config-file", str(models), "--model", MODEL, "--preload"]
            command += ["--log-level", "warning"]
            command += ["--auth-jwt-enabled", "--auth-jwt-limit-store", redis_url]
            processes.append(
                subprocess.Popen(
                    command,
                    env=environment,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.STDOUT,
                )
            )
            urls.append(f"http://127.0.0.1:{port}")
        for url, process in zip(urls, processes, strict=True):
            _wait_ready(url, process)
        yield urls
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)


def _wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, f"server on {url} exited with {process.returncode}"
        try:
            if httpx.get(f"{url}/v1/readiness", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"server on {url} not ready")


def test_two_servers_sharing_redis_admit_exactly_the_quota(
    tmp_path: Path, two_servers: list[str], redis_url: str
) -> None:
    token = local_token(tmp_path, "tokenize:10/day")
    statuses = asyncio.run(hammer(two_servers, token, 100))
    assert statuses.count(200) == 10, statuses
    assert statuses.count(429) == 90, statuses
    # The count lives in Redis, not in a SQLite file the two happen to share.
    subject = jwt.decode(token, options={"verify_signature": False})["sub"]
    counters = redis.Redis.from_url(redis_url).keys(f"kronk:limit:{subject}:tokenize:day:*")
    assert len(counters) == 1
    assert not (tmp_path / "limits.db").exists()


def test_a_stopped_redis_makes_limited_calls_503(
    tmp_path: Path, serve: Serve, redis_server: RedisServer
) -> None:
    """Redis stopped under a running server: limited calls get 503 in their dialect's shape,
    the rest is served, and the store is used again once Redis is back."""
    limited = local_token(tmp_path, "chat-completions:100/day,messages:100/day")
    unlimited = local_token(tmp_path, "chat-completions")
    admin = (tmp_path / "keys" / "master.jwt").read_text()
    settings = ServerSettings(
        base_path=tmp_path,
        sections={"auth-jwt": {"enabled": True, "limit_store": redis_server.url}},
    )
    # Answered 404 once past the guard: no model has to load.
    chat = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
    messages = {**chat, "max_tokens": 1}
    with (
        serve(create_app(settings, kronk=Kronk(KronkConfig(base_path=tmp_path)))) as base_url,
        httpx.Client(base_url=base_url, timeout=30) as http,
    ):
        assert (
            http.post("/v1/chat/completions", json=chat, headers=bearer(limited)).status_code == 404
        )
        redis_server.stop()

        refused = http.post("/v1/chat/completions", json=chat, headers=bearer(limited))
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"] == {
            "message": "the rate-limit store is unavailable; retry later",
            "type": "service_unavailable",
            "code": "unavailable",
            "param": None,
        }
        anthropic = http.post("/v1/messages", json=messages, headers={"x-api-key": limited})
        assert anthropic.status_code == 503, anthropic.text
        assert anthropic.json()["type"] == "error"
        assert anthropic.json()["error"]["type"] == "overloaded_error"
        for token in (unlimited, admin):  # nothing to count: served as before
            response = http.post("/v1/chat/completions", json=chat, headers=bearer(token))
            assert response.status_code == 404, response.text
        assert http.get("/v1/liveness").status_code == 200
        assert http.get("/v1/readiness").status_code == 200

        redis_server.start()
        assert (
            http.post("/v1/chat/completions", json=chat, headers=bearer(limited)).status_code == 404
        )


# ---- the limit-store registry (auth-jwt's own hook) --------------------------------


class MemoryStore:
    """A third-party store: counters in a dict, for one process."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.closed = False

    async def acquire(self, key: str, limit: int, expires_at: float) -> bool:
        if self.counts.get(key, 0) >= limit:
            return False
        self.counts[key] = self.counts.get(key, 0) + 1
        return True

    def close(self) -> None:
        self.closed = True


class MemoryStorePlugin:
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.opened: list[tuple[str, Path]] = []

    def open(self, url: str, base_path: Path) -> MemoryStore:
        self.opened.append((url, base_path))
        return self.store

    @hookimpl(optionalhook=True)
    def kronk_register_limit_stores(self, register: Callable[[str, Any], None]) -> None:
        register("memory", self.open)

    @hookimpl
    def kronk_app(self, app_config: AppConfig) -> None:
        app_config.route_handlers.append(counted)


def test_a_plugin_store_answers_for_its_scheme(tmp_path: Path, serve: Serve) -> None:
    plugin = MemoryStorePlugin()
    kronk = Kronk(KronkConfig(base_path=tmp_path), plugins={"memory-store": plugin})
    stores = kronk.registry("limit_stores")
    assert stores.owners["memory"] == "memory-store" and stores.owners["redis"] == "auth-jwt"
    settings = ServerSettings(
        base_path=tmp_path, sections={"auth-jwt": {"enabled": True, "limit_store": "memory://"}}
    )
    token = local_token(tmp_path, "probe:2/month")
    app = create_app(settings, kronk=kronk)
    with serve(app) as base_url:
        # One month for all three calls, whenever the test runs.
        app.state[TOKEN_CHECKER].clock = lambda: datetime(2031, 3, 31, 23, 59, tzinfo=UTC)
        statuses = [
            httpx.get(f"{base_url}/probe/counted", headers=bearer(token)).status_code
            for _ in range(3)
        ]
    assert statuses == [200, 200, 429]
    assert list(plugin.store.counts.values()) == [2]
    assert next(iter(plugin.store.counts)).endswith(":probe:month:2031-03-01")
    assert plugin.store.closed
    assert plugin.opened == [("memory://", tmp_path)]
    assert not (tmp_path / "limits.db").exists()


def test_an_unregistered_store_scheme_stops_the_server(tmp_path: Path) -> None:
    kronk = Kronk(KronkConfig(base_path=tmp_path))
    settings = ServerSettings(
        base_path=tmp_path, sections={"auth-jwt": {"enabled": True, "limit_store": "nope://x"}}
    )
    app = create_app(settings, kronk=kronk)
    # Raised from the plugin's lifespan: the server does not start.
    with pytest.raises(BaseExceptionGroup) as info, TestClient(app):
        pass
    assert info.group_contains(ConfigError, match=r"^auth-jwt\.limit_store: .*'nope'.*redis")


def test_a_redis_store_without_the_redis_extra_stops_the_server_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if kronk-auth-jwt were installed without its `redis` extra.
    monkeypatch.setitem(sys.modules, "redis", None)
    monkeypatch.delitem(sys.modules, "kronk_auth_jwt.redis_store")
    kronk = Kronk(KronkConfig(base_path=tmp_path))
    url = "redis://:hunter2@127.0.0.1:6379/0"
    settings = ServerSettings(
        base_path=tmp_path, sections={"auth-jwt": {"enabled": True, "limit_store": url}}
    )
    app = create_app(settings, kronk=kronk)
    with pytest.raises(BaseExceptionGroup) as info, TestClient(app):
        pass
    assert info.group_contains(
        ConfigError,
        match=r"^auth-jwt\.limit_store: a redis:// store needs the redis package: "
        r"pip install 'kronk-auth-jwt\[redis\]'$",  # the URL's password never shown
    )
