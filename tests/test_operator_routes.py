"""The Kronk manual's operator routes on a real server: loaded models (`ps`), IMC sessions,
the pool's memory budget, devices and llama.cpp's libraries; admin tokens only."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import httpx
import pytest

from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_llamacpp.packaged import GEMMA_MODEL_ID
from kronk_testing.auth import AuthServer, bearer, mint, serving_with_auth
from kronk_testing.plugin import IMC_MODEL_ID
from kronk_testing.server import RunningServer

ROUTES = [
    "/v1/kronk/models/ps",
    "/v1/kronk/models/imc-sessions",
    "/v1/pool/budget",
    "/v1/devices",
    "/v1/kronk/libs",
]


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    """A server with authentication on, its model small (nothing here generates)."""
    small = {GEMMA_MODEL_ID: ModelConfig(context_window=512, n_seq_max=2)}
    kronk = Kronk(KronkConfig(base_path=tmp_path_factory.mktemp("operator-home"), models=small))
    with serving_with_auth(kronk) as server:
        yield server


@pytest.mark.parametrize("route", ROUTES)
def test_operator_routes_need_the_admin_grant(auth_server: AuthServer, route: str) -> None:
    url = f"{auth_server.base_url}{route}"
    assert httpx.get(url).status_code == 401
    user = mint(auth_server, "chat-completions,embeddings")
    refused = httpx.get(url, headers=bearer(user))
    assert refused.status_code == 403, refused.text
    assert httpx.get(url, headers=bearer(auth_server.admin)).status_code == 200


def test_shapes(server: RunningServer) -> None:
    base = server.base_url
    # One conversation on the IMC model, so that it is loaded and a slot keeps it.
    answer = httpx.post(
        f"{base}/v1/chat/completions",
        json={
            "model": IMC_MODEL_ID,
            "messages": [{"role": "user", "content": "Hello there"}],
            "max_tokens": 4,
        },
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    server.kronk.load(GEMMA_MODEL_ID)

    ps = httpx.get(f"{base}/v1/kronk/models/ps").json()
    assert isinstance(ps, list)
    entry = next(item for item in ps if item["id"] == IMC_MODEL_ID)
    assert entry["status"] == "loaded" and entry["slots"] == 2
    assert entry["model_family"] == "gemma3" and entry["size"] > 0
    assert entry["vram_total"] > 0 and entry["kv_cache"] > 0
    assert entry["active_streams"] == 0
    assert entry["expires_at"] is None or datetime.fromisoformat(entry["expires_at"])

    sessions = httpx.get(f"{base}/v1/kronk/models/imc-sessions").json()
    # IMC models only (the session's server may hold others that earlier tests loaded).
    slots = httpx.get(f"{base}/v1/kronk/slots").json()["data"]
    imc_models = {model["model"] for model in slots if model["cache"] == "imc"}
    assert IMC_MODEL_ID in {session["model_id"] for session in sessions} <= imc_models
    sessions = [session for session in sessions if session["model_id"] == IMC_MODEL_ID]
    assert [session["id"] for session in sessions] == [0, 1]
    kept = [session for session in sessions if session["state"] == "cached"]
    assert kept and kept[0]["context"] > 0 and kept[0]["context_window"] == 4096
    assert datetime.fromisoformat(kept[0]["last_used"])

    budget = httpx.get(f"{base}/v1/pool/budget").json()
    assert budget["models_in_cache"] == 5 and budget["models_loaded"] >= 2
    cpu = next(device for device in budget["devices"] if device["type"] == "cpu")
    assert 0 < cpu["free_bytes"] <= cpu["total_bytes"] and cpu["used_bytes"] > 0
    keys = {reservation["key"] for reservation in budget["reservations"]}
    assert {IMC_MODEL_ID, GEMMA_MODEL_ID} <= keys

    devices = httpx.get(f"{base}/v1/devices").json()
    assert devices == httpx.get(f"{base}/v1/kronk/devices").json() or devices["data"]

    libs = httpx.get(f"{base}/v1/kronk/libs").json()
    assert libs["current"] and libs["directory"] and isinstance(libs["installed"], list)
    assert libs["os"] and libs["arch"]
