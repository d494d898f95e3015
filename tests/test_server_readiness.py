"""/v1/readiness on a real server: ready before the default model loads, its state in the
body; llama-server's /health answers the same, in its own shape."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, LoadedModel, ModelConfig
from kronk_testing.waiting import gated, reached

if TYPE_CHECKING:
    from kronk_testing.server import Serve

TINY = "tiny"
CHAT = "/v1/chat/completions"


@dataclass
class LoadGate:
    """Holds every model load until `open` is set, and says when one has begun."""

    begun: threading.Event
    open: threading.Event


@pytest.fixture
def tiny_server(
    tmp_path: Path, serve: Serve, tiny_llama_path: Path
) -> Iterator[tuple[str, Kronk, LoadGate]]:
    """A server whose default model is the tiny chat model, not loaded at start."""
    model = ModelConfig(model_path=tiny_llama_path, template="chatml", context_window=256)
    kronk = Kronk(KronkConfig(base_path=tmp_path, default_model=TINY, models={TINY: model}))
    gate = LoadGate(begun=threading.Event(), open=threading.Event())
    load = kronk.pool._load

    def gated(model_id: str) -> Any:
        gate.begun.set()
        gate.open.wait()
        return load(model_id)

    kronk.pool._load = gated
    with serve(create_app(ServerSettings(base_path=tmp_path), kronk=kronk), lifespan="off") as url:
        try:
            yield url, kronk, gate
        finally:
            gate.open.set()
            kronk.close()


def status_of(base_url: str) -> int:
    """Readiness's status alone, to wait for a change (health may answer a moment later)."""
    return httpx.get(f"{base_url}/v1/readiness", timeout=30).status_code


def readiness(base_url: str) -> tuple[int, dict[str, Any]]:
    """/v1/readiness's status and body; llama-server's /health (and /v1/health) must agree."""
    response = httpx.get(f"{base_url}/v1/readiness", timeout=30)
    body: dict[str, Any] = response.json()
    # The load is checked in test_affinity_drain.py; here, the model's state.
    load = body.pop("load")
    assert response.headers["x-kronk-load"].startswith(f"slots_busy={load['slots_busy']};")
    for path in ("/health", "/v1/health"):
        health = httpx.get(f"{base_url}{path}", timeout=30)
        assert health.status_code == response.status_code, path
        if response.status_code == 200:
            assert health.json() == {"status": "ok"}
        else:
            why = body["status"] + (f": {body['error']}" if "error" in body else "")
            assert health.json() == {
                "error": {"code": 503, "message": why, "type": "unavailable_error"}
            }
    return response.status_code, body


def test_ready_before_the_first_request_then_loading_then_loaded(
    tiny_server: tuple[str, Kronk, LoadGate],
) -> None:
    """An orchestrator that waits for readiness before sending traffic gets a 200 at once."""
    base_url, kronk, gate = tiny_server
    assert readiness(base_url) == (
        200,
        {"status": "ready", "model": TINY, "model_state": "not_loaded"},
    )
    with httpx.Client(base_url=base_url, timeout=120) as http:
        loader = threading.Thread(
            target=http.post,
            args=(CHAT,),
            kwargs={"json": {"model": TINY, "messages": [{"role": "user", "content": "hi"}]}},
        )
        loader.start()
        try:
            assert gate.begun.wait(60)
            assert readiness(base_url) == (
                200,
                {"status": "ready", "model": TINY, "model_state": "loading"},
            )
        finally:
            gate.open.set()
            loader.join(120)
    assert readiness(base_url) == (200, {"status": "ready", "model": TINY, "model_state": "loaded"})
    kronk.unload(TINY)
    assert readiness(base_url)[1]["model_state"] == "not_loaded"


def test_a_stopped_engine_is_503(tiny_server: tuple[str, Kronk, LoadGate]) -> None:
    base_url, kronk, gate = tiny_server
    gate.open.set()
    loaded = kronk.load()
    loaded.engine.close()  # type: ignore[union-attr]
    assert readiness(base_url) == (
        503,
        {"status": "not ready", "model": TINY, "model_state": "stopped"},
    )


def test_shutting_down_is_503(tiny_server: tuple[str, Kronk, LoadGate]) -> None:
    base_url, kronk, _ = tiny_server
    kronk.close()
    status, body = readiness(base_url)
    assert (status, body["status"]) == (503, "shutting down")


def test_a_failed_load_is_503_until_a_load_succeeds(
    tmp_path: Path, serve: Serve, tiny_llama_path: Path
) -> None:
    """The failure is reported without its details (they name files); a request retries."""
    model = tmp_path / "default.gguf"
    model.write_bytes(b"GGUF but not really")
    config = ModelConfig(model_path=model, template="chatml", context_window=256)
    kronk = Kronk(KronkConfig(base_path=tmp_path, default_model=TINY, models={TINY: config}))
    app = create_app(ServerSettings(base_path=tmp_path), kronk=kronk)
    chat = {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    with serve(app) as base_url, httpx.Client(base_url=base_url, timeout=120) as http:
        assert readiness(base_url)[0] == 200
        assert http.post(CHAT, json=chat).status_code == 500
        assert readiness(base_url) == (
            503,
            {
                "status": "not ready",
                "model": TINY,
                "model_state": "failed",
                "error": "model_load_failed",
            },
        )
        model.write_bytes(tiny_llama_path.read_bytes())  # the operator fixes the file
        assert http.post(CHAT, json=chat).status_code == 200
        assert readiness(base_url)[1]["model_state"] == "loaded"


def test_an_engine_stuck_in_a_step_is_503_until_the_step_ends(
    tmp_path: Path, serve: Serve, tiny_llama_path: Path
) -> None:
    """An engine held in a decode step (gated) past engine_step_deadline: readiness names
    the model whose engine is stuck and for how long; once the step ends, it is ready."""
    model = ModelConfig(model_path=tiny_llama_path, template="chatml", context_window=256)
    kronk = Kronk(KronkConfig(base_path=tmp_path, default_model=TINY, models={TINY: model}))
    settings = ServerSettings(base_path=tmp_path, engine_step_deadline=0.5)
    chat = {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    try:
        loaded = kronk.load()
        assert isinstance(loaded, LoadedModel)
        with (
            serve(create_app(settings, kronk=kronk), lifespan="off") as base_url,
            httpx.Client(base_url=base_url, timeout=120) as http,
            gated(loaded.engine) as gate,
        ):
            asking = threading.Thread(target=http.post, args=(CHAT,), kwargs={"json": chat})
            asking.start()
            try:
                assert gate.held.wait(60)
                assert reached(lambda: status_of(base_url) == 503, 30)
                status, body = readiness(base_url)
                assert body["stuck_seconds"] >= 0.5  # rounded to a tenth
                del body["stuck_seconds"]
                assert (status, body) == (
                    503,
                    {
                        "status": "not ready",
                        "model": TINY,
                        "model_state": "loaded",
                        "error": "engine_stuck",
                        "stuck_model": TINY,
                    },
                )
            finally:
                gate.release()
                asking.join(120)
            assert reached(lambda: status_of(base_url) == 200, 30)
    finally:
        kronk.close()
