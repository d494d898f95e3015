"""auth-jwt.host (the manual's --auth-host): replicas whose tokens another Kronk server
checks with its keys, issuer and rate limits, shared by every replica."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_testing.auth import AuthServer, bearer, mint, serving_with_auth

if TYPE_CHECKING:
    from kronk_testing.server import Serve

MODEL = "SmolLM2-135M-Instruct-Q4_1"
CHAT = "/v1/chat/completions"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@dataclass
class Servers:
    service: AuthServer
    replica: str


def _kronk(base: Path) -> Kronk:
    models = {MODEL: ModelConfig(context_window=512, n_seq_max=1)}
    return Kronk(KronkConfig(base_path=base, models=models))


def _app(base: Path, **settings: Any) -> Any:
    server = ServerSettings.model_validate({"base_path": base, **settings})
    return create_app(server, kronk=_kronk(base))


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, serve: Serve) -> Iterator[Servers]:
    with serving_with_auth(_kronk(tmp_path_factory.mktemp("auth-service"))) as service:
        replica_base = tmp_path_factory.mktemp("replica")
        # The manual's keys (a settings file's `auth_enabled`, `auth_host`; --auth-host).
        host = service.api_host
        with serve(_app(replica_base, auth_enabled=True, auth_host=host)) as replica:
            assert not (replica_base / "keys").exists()  # the replica holds no keys
            yield Servers(service, replica)


def error_of(response: httpx.Response) -> str:
    message: str = response.json()["error"]["message"]
    return message


@pytest.mark.model
def test_the_replica_admits_what_the_service_admits(servers: Servers) -> None:
    token = mint(servers.service, "chat-completions")
    answer = httpx.post(f"{servers.replica}{CHAT}", json=BODY, headers=bearer(token), timeout=60)
    assert answer.status_code == 200, answer.text
    # Anthropic's clients send the token as x-api-key; it is passed on the same way.
    models = httpx.get(f"{servers.replica}/v1/models", headers={"x-api-key": token})
    assert models.status_code == 200
    admin = httpx.get(f"{servers.replica}/v1/kronk/slots", headers=bearer(servers.service.admin))
    assert admin.status_code == 200


def test_the_replica_refuses_what_the_service_refuses(servers: Servers) -> None:
    anonymous = httpx.post(f"{servers.replica}{CHAT}", json=BODY)
    assert anonymous.status_code == 401
    assert "missing bearer token" in error_of(anonymous)
    forged = httpx.post(f"{servers.replica}{CHAT}", json=BODY, headers=bearer("a.b.c"))
    assert forged.status_code == 401
    other = mint(servers.service, "tokenize")
    denied = httpx.post(f"{servers.replica}{CHAT}", json=BODY, headers=bearer(other))
    assert denied.status_code == 403
    assert "does not grant the 'chat-completions' endpoint" in error_of(denied)
    not_admin = httpx.get(f"{servers.replica}/v1/kronk/slots", headers=bearer(other))
    assert not_admin.status_code == 403


@pytest.mark.model
def test_one_quota_across_the_service_and_the_replica(servers: Servers) -> None:
    token = mint(servers.service, "tokenize:2/day")
    body = {"model": MODEL, "input": "hi"}
    first = httpx.post(f"{servers.service.base_url}/v1/tokenize", json=body, headers=bearer(token))
    second = httpx.post(f"{servers.replica}/v1/tokenize", json=body, headers=bearer(token))
    third = httpx.post(f"{servers.replica}/v1/tokenize", json=body, headers=bearer(token))
    assert [first.status_code, second.status_code, third.status_code] == [200, 200, 429]
    assert "quota of 2 tokenize requests per day used up" in error_of(third)
    assert int(third.headers["retry-after"]) >= 1


def test_keys_are_managed_on_the_service_only(servers: Servers) -> None:
    admin = bearer(servers.service.admin)
    answer = httpx.get(f"{servers.replica}/v1/kronk/security/keys", headers=admin)
    assert answer.status_code == 400
    assert "checked by the auth service at 127.0.0.1:" in error_of(answer)


def test_an_unreachable_service_is_a_503_not_an_open_door(tmp_path: Path, serve: Serve) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nobody = f"127.0.0.1:{probe.getsockname()[1]}"
    with serve(_app(tmp_path, **{"auth-jwt": {"enabled": True, "host": nobody}})) as replica:
        answer = httpx.post(f"{replica}{CHAT}", json=BODY, headers=bearer("a.b.c"))
        assert answer.status_code == 503
        assert f"the auth service at http://{nobody}" in error_of(answer)
        assert "did not answer" in error_of(answer)
        assert httpx.get(f"{replica}/v1/liveness").status_code == 200  # public routes stay up


@dataclass
class FakeService:
    """A local HTTP server playing the auth service: every check gets `answer` with a 200."""

    host: str
    answer: bytes = b'{"subject": "someone", "admin": false}'


@pytest.fixture(scope="module")
def fake_service() -> Iterator[FakeService]:
    service = FakeService(host="")

    class CheckHandler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(service.answer)))
            self.end_headers()
            self.wfile.write(service.answer)

        def log_message(self, *_: Any) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), CheckHandler)
    service.host = f"127.0.0.1:{http.server_address[1]}"
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield service
    finally:
        http.shutdown()
        http.server_close()


@pytest.fixture(scope="module")
def loose_replica(
    fake_service: FakeService, tmp_path_factory: pytest.TempPathFactory, serve: Serve
) -> Iterator[str]:
    settings = {"auth-jwt": {"enabled": True, "host": fake_service.host}}
    with serve(_app(tmp_path_factory.mktemp("loose-replica"), **settings)) as replica:
        yield replica


@pytest.mark.model
def test_a_well_formed_answer_admits(fake_service: FakeService, loose_replica: str) -> None:
    fake_service.answer = b'{"subject": "someone", "admin": false, "extra": 1}'
    answer = httpx.get(f"{loose_replica}/v1/models", headers=bearer("a.b.c"))
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize(
    "answer",
    [
        {"subject": "someone", "admin": "false"},
        {"subject": "someone", "admin": "true"},
        {"subject": "someone", "admin": 1},
        {"subject": "someone", "admin": None},
        {"subject": "someone"},
        {"subject": 7, "admin": False},
        {"subject": "", "admin": False},
        {"subject": "s" * 100_000, "admin": False},
        ["someone", False],
        "not json",
    ],
    ids=lambda answer: json.dumps(answer)[:40],
)
def test_an_answer_out_of_shape_fails_closed_and_is_logged(
    fake_service: FakeService,
    loose_replica: str,
    answer: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing is read into the answer by conversion (`"admin": "false"` is not a boolean):
    the request is refused with the 503 of a broken auth service, and the log says why."""
    fake_service.answer = (
        answer.encode() if isinstance(answer, str) else json.dumps(answer).encode()
    )
    with caplog.at_level("WARNING", logger="kronk_auth_jwt.remote"):
        refused = httpx.get(f"{loose_replica}/v1/models", headers=bearer("a.b.c"))
    assert refused.status_code == 503, refused.text
    assert f"the auth service at http://{fake_service.host}" in error_of(refused)
    assert "answered nonsense" in error_of(refused)
    assert any("answered a check out of shape" in record.message for record in caplog.records)
