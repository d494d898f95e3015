"""Every server-side hook, exercised by an in-process third-party plugin."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import click
import pytest
from click.testing import CliRunner
from litestar import Litestar, Request, Response, get
from litestar.config.app import AppConfig
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers import BaseRouteHandler
from litestar.testing import TestClient
from litestar.types import ASGIApp, Receive, Scope, Send

from kronk_api import ServerSettings, create_app
from kronk_api.cli import KronkGroup
from kronk_core import Kronk, KronkConfig, ModelConfig, hookimpl
from kronk_core.contract.backend import ModelInfo
from kronk_core.records import ChatRecord, RequestRecord, current_request_id
from kronk_llamacpp.packaged import GEMMA_MODEL_ID, GEMMA_MODEL_SETTINGS


class Teapot(Exception):
    pass


@get("/probe/teapot")
async def teapot() -> None:
    raise Teapot


def no_forbidden_header(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    if connection.headers.get("x-forbidden"):
        raise NotAuthorizedException("forbidden header")


def stamp(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        async def send_stamped(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message["headers"], (b"x-probe", b"1")]}
            await send(message)

        await app(scope, receive, send_stamped)

    return middleware


class Probe:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.records: list[RequestRecord] = []
        self.chats: list[ChatRecord] = []
        self.loads: list[tuple[str, str, float]] = []
        # The request id the engine thread had set while it reported each record.
        self.logged_ids: list[str | None] = []

    @hookimpl
    def kronk_app(self, app_config: AppConfig, kronk: Kronk) -> None:
        def handle(_: Request[Any, Any, Any], __: Teapot) -> Response[Any]:
            return Response({"error": {"message": "short and stout"}}, status_code=418)

        app_config.route_handlers.append(teapot)
        app_config.guards.append(no_forbidden_header)
        app_config.middleware.append(stamp)
        app_config.exception_handlers[Teapot] = handle
        app_config.lifespan.append(self.lifespan)

    @asynccontextmanager
    async def lifespan(self, app: Litestar) -> AsyncIterator[None]:
        # The app carries the server settings and room for the plugin's own state.
        app.state["probe_started_on"] = app.state.settings.api_host
        self.events.append("startup")
        yield
        assert app.state["probe_started_on"] == app.state.settings.api_host
        self.events.append("shutdown")

    @hookimpl
    def kronk_request_finished(self, record: RequestRecord) -> None:
        self.records.append(record)
        self.logged_ids.append(current_request_id.get())

    @hookimpl
    def kronk_chat_finished(self, record: ChatRecord) -> None:
        self.chats.append(record)

    @hookimpl
    def kronk_model_loaded(
        self, model_config: ModelConfig, model_info: ModelInfo, seconds: float
    ) -> None:
        self.loads.append((model_config.id, model_info.id, seconds))

    @hookimpl
    def kronk_cli(self, group: click.Group) -> None:
        @group.command("hello")
        def hello() -> None:
            click.echo("hello from a plugin")


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Probe, Kronk]]:
    probe = Probe()
    config = KronkConfig(
        base_path=tmp_path_factory.mktemp("hooks"),
        default_model=GEMMA_MODEL_ID,
        models={GEMMA_MODEL_ID: ModelConfig.model_validate(GEMMA_MODEL_SETTINGS)},
    )
    kronk = Kronk(config, plugins={"probe": probe})
    yield probe, kronk
    kronk.close()


def test_server_hooks(probed: tuple[Probe, Kronk]) -> None:
    probe, kronk = probed
    app = create_app(ServerSettings(), kronk=kronk)
    body = {
        "model": GEMMA_MODEL_ID,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "temperature": 0,
    }
    with TestClient(app) as client:
        assert probe.events == ["startup"]
        teapot = client.get("/probe/teapot")
        assert teapot.status_code == 418 and teapot.json()["error"]["message"] == "short and stout"
        assert teapot.headers["x-probe"] == "1"
        assert client.get("/v1/liveness", headers={"x-forbidden": "1"}).status_code == 401
        answer = client.post("/v1/chat/completions", json=body, headers={"X-Request-ID": "r-9"})
        assert answer.status_code == 200
    assert probe.events == ["startup", "shutdown"]
    (record,) = probe.records
    assert record.model == GEMMA_MODEL_ID
    assert record.finish_reason == "length" and record.completion_tokens == 4
    assert record.prompt_tokens == answer.json()["usage"]["prompt_tokens"]
    assert record.total_seconds >= record.time_to_first_token > 0
    # The client's request id, in the record and around the engine's report.
    assert record.request_id == "r-9" and probe.logged_ids == ["r-9"]
    moments = [
        record.enqueued_at,
        record.started_at,
        record.cache_ready_at,
        record.prefilled_at,
        record.first_token_at,
        record.finished_at,
    ]
    assert moments[0] > 0 and moments == sorted(moments)
    assert record.prefill_tokens == record.prompt_tokens - record.cached_tokens
    assert record.tokens_per_second > 0 and record.slot >= 0
    (chat,) = probe.chats
    assert chat.request_id == "r-9" and chat.generation == record
    assert chat.finish_reason == "length" and chat.usage.completion_tokens == 4
    assert chat.started_at <= chat.prompt_started_at <= chat.prompt_ready_at
    assert chat.prompt_ready_at == record.enqueued_at <= record.finished_at <= chat.finished_at
    assert chat.tools == chat.tool_calls == 0 and chat.parse_seconds > 0
    # The first request loaded the model.
    ((config_id, info_id, seconds),) = probe.loads
    assert config_id == GEMMA_MODEL_ID and info_id and seconds > 0


def test_cli_hook_adds_a_command(probed: tuple[Probe, Kronk]) -> None:
    _, kronk = probed
    group = KronkGroup(name="kronk")
    kronk.hook.kronk_cli(group=group)
    result = CliRunner().invoke(group, ["hello"])
    assert result.exit_code == 0 and result.output == "hello from a plugin\n"
