"""auth-jwt.host (the manual's --auth-host): replicas whose tokens another Kronk server
checks with its keys, issuer and rate limits, shared by every replica."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
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
