"""The dialect plumbing exists once: one error table per shape, one unexpected-error policy,
one Retry-After, one SSE framing and keep-alive."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from litestar import Router, get
from litestar.config.app import AppConfig
from litestar.testing import TestClient
from openai._streaming import SSEDecoder

from kronk_anthropic.errors import ANTHROPIC
from kronk_api import ServerSettings, create_app
from kronk_api.dialect import Dialect, sse_frame
from kronk_api.endpoints import ENDPOINT_OPT, PUBLIC
from kronk_core import Kronk, KronkConfig, hookimpl
from kronk_core.contract.errors import QueueFullError
from kronk_ollama.errors import OLLAMA
from kronk_openai.errors import OPENAI

SECRET = "the user's secret prompt"


@get("/probe/anthropic-boom", opt={ENDPOINT_OPT: PUBLIC})
async def anthropic_boom() -> None:
    raise RuntimeError(SECRET)


class Boom:
    """A route in Anthropic's router shape that fails unexpectedly, quoting the request."""

    @hookimpl
    def kronk_app(self, app_config: AppConfig) -> None:
        app_config.route_handlers.append(
            Router(
                path="/",
                route_handlers=[anthropic_boom],
                exception_handlers=ANTHROPIC.exception_handlers(),
            )
        )


@pytest.fixture
def probe(tmp_path: Path) -> Iterator[Kronk]:
    kronk = Kronk(KronkConfig(base_path=tmp_path), plugins={"boom": Boom()})
    yield kronk
    kronk.close()


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (405, "invalid_request_error"),
        (409, "invalid_request_error"),
        (413, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "server_error"),
        (502, "server_error"),
        (503, "service_unavailable"),
    ],
)
def test_one_openai_error_table(status: int, kind: str) -> None:
    assert OPENAI.error_type(status) == kind


def test_the_server_and_the_openai_routes_answer_errors_alike(probe: Kronk) -> None:
    with TestClient(create_app(ServerSettings(), kronk=probe)) as client:
        server_405 = client.post("/v1/liveness")  # a route of the server itself
        openai_405 = client.delete("/v1/models")  # a route of the openai plugin
        unknown = client.get("/v1/nowhere")
    for response in (server_405, openai_405):
        assert response.status_code == 405
        assert response.json()["error"] | {"message": ""} == {
            "message": "",
            "type": "invalid_request_error",
            "code": "405",
            "param": None,
        }
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(
    "dialect", [OPENAI, ANTHROPIC, OLLAMA], ids=["openai", "anthropic", "ollama"]
)
def test_retry_after_comes_with_every_dialect_s_429(dialect: Dialect) -> None:
    response = dialect.error_response(QueueFullError("queue full", retry_after=7))
    assert response.status_code == 429 and response.headers["Retry-After"] == "7"


@pytest.mark.parametrize("insecure", [False, True], ids=["secure", "insecure"])
def test_anthropic_s_unexpected_errors_follow_insecure_logging(
    probe: Kronk, caplog: pytest.LogCaptureFixture, insecure: bool
) -> None:
    app = create_app(ServerSettings(insecure_logging=insecure), kronk=probe)
    with caplog.at_level(logging.ERROR), TestClient(app) as client:
        response = client.get("/probe/anthropic-boom")
    assert response.status_code == 500
    assert response.json()["error"] == {"type": "api_error", "message": "internal server error"}
    logged = caplog.text
    assert "RuntimeError" in logged and "/probe/anthropic-boom" in logged
    assert (SECRET in logged) is insecure


def test_sse_frames_and_the_keepalive_clients_skip() -> None:
    assert sse_frame({"a": 1}) == b'data: {"a": 1}\n\n'
    assert sse_frame({"a": 1}, "tick") == b'event: tick\ndata: {"a": 1}\n\n'
    # OpenAI's own client reads past the keep-alive comment to the data.
    stream = [Dialect.keepalive_frame, sse_frame({"id": "x"}), Dialect.keepalive_frame]
    events = list(SSEDecoder().iter_bytes(iter(stream)))
    assert [(event.event, event.data) for event in events] == [(None, '{"id": "x"}')]
