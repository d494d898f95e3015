"""X-Kronk-Session, X-Kronk-Replica, readiness's load, and the drain of `kronk server stop`."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from kronk_api import ServerSettings, create_app
from kronk_api.affinity import derive_session
from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_llamacpp.packaged import DEFAULT_MODEL_ID

if TYPE_CHECKING:
    from kronk_testing.server import RunningServer, Serve

CHAT = "/v1/chat/completions"
SYSTEM = {"role": "system", "content": "Be brief."}
FIRST = {"role": "user", "content": "Hi!"}
# SmolLM2's <|endoftext|> and <|im_end|> banned: a generation runs to max_tokens.
NO_END = {"0": -100, "2": -100}


def test_every_turn_of_a_conversation_derives_one_session() -> None:
    turn1 = {"messages": [SYSTEM, FIRST]}
    turn2 = {"messages": [SYSTEM, FIRST, {"role": "assistant", "content": "Hello."}, FIRST]}
    assert derive_session("alice", turn1) == derive_session("alice", turn2)
    assert derive_session("alice", turn1) != derive_session("bob", turn1)  # per tenant
    other = {"messages": [SYSTEM, {"role": "user", "content": "Bye!"}]}
    assert derive_session("alice", turn1) != derive_session("alice", other)
    # Anthropic's system field, the Responses API's instructions and input.
    messages = {"system": "Be brief.", "messages": [FIRST]}
    assert derive_session(None, messages) == derive_session(None, {**messages, "x": 1})
    assert derive_session(None, {"instructions": "Be brief.", "input": "Hi!"}) is not None
    assert derive_session(None, {"model": "m"}) is None
    assert derive_session(None, ["not", "a", "body"]) is None


def _chat(url: str, messages: list[dict[str, str]], **headers: str) -> httpx.Response:
    body = {"model": DEFAULT_MODEL_ID, "messages": messages, "max_tokens": 2}
    return httpx.post(url + CHAT, json=body, headers=headers, timeout=120)


def test_chat_responses_carry_the_session_and_the_replica(server: RunningServer) -> None:
    first = _chat(server.base_url, [SYSTEM, FIRST])
    assert first.status_code == 200, first.text
    session = first.headers["x-kronk-session"]
    assert len(session) == 32
    reply = {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]}
    second = _chat(server.base_url, [SYSTEM, FIRST, reply, {"role": "user", "content": "More"}])
    assert second.headers["x-kronk-session"] == session
    assert second.headers["x-kronk-replica"] == ServerSettings().api_host
    # The client's own is echoed as given.
    given = _chat(server.base_url, [SYSTEM, FIRST], **{"X-Kronk-Session": "mine-1"})
    assert given.headers["x-kronk-session"] == "mine-1"
    # Other routes name the replica, not a session.
    models = httpx.get(f"{server.base_url}/v1/models")
    assert "x-kronk-session" not in models.headers and "x-kronk-replica" in models.headers


def _load(url: str) -> tuple[int, dict[str, Any], str]:
    answer = httpx.get(f"{url}/v1/readiness", timeout=30)
    return answer.status_code, answer.json(), answer.headers["x-kronk-load"]


def test_readiness_is_503_while_every_slot_is_busy_and_the_queue_full(
    tmp_path: Path, serve: Serve
) -> None:
    one = ModelConfig(context_window=512, n_seq_max=1, queue_depth=1, cache="none")
    kronk = Kronk(KronkConfig(base_path=tmp_path, models={DEFAULT_MODEL_ID: one}))
    kronk.load()
    app = create_app(ServerSettings(base_path=tmp_path, queue_wait_seconds=0), kronk=kronk)
    with serve(app) as url:
        status, body, header = _load(url)
        assert status == 200 and body["load"]["slots_total"] == 1
        assert header == "slots_busy=0; slots_total=1; queued=0"
        long = {"model": DEFAULT_MODEL_ID, "prompt": "Count:", "max_tokens": 400}
        long["logit_bias"] = NO_END
        results: list[int] = []

        def generate() -> None:
            answer = httpx.post(f"{url}/v1/completions", json=long, timeout=120)
            results.append(answer.status_code)

        threads = [threading.Thread(target=generate) for _ in range(2)]
        for thread in threads:
            thread.start()
        # One takes the slot, the other the queue's one place; a loaded machine may take a
        # while to get both there, so the test waits for it rather than for a fixed time.
        deadline = time.monotonic() + 60
        busy = _load(url)
        while busy[2] != "slots_busy=1; slots_total=1; queued=1" and time.monotonic() < deadline:
            time.sleep(0.05)
            busy = _load(url)
        assert busy[0] == 503, busy
        assert busy[1]["status"] == "busy" and busy[1]["load"]["saturated"]
        assert busy[2] == "slots_busy=1; slots_total=1; queued=1"
        for thread in threads:
            thread.join()
        assert results == [200, 200]
        assert _load(url)[0] == 200


def test_server_stop_drains_running_requests_before_it_exits(
    tmp_path: Path, port_finder: Callable[[], int]
) -> None:
    port = port_finder()
    url = f"http://127.0.0.1:{port}"
    env = {key: value for key, value in os.environ.items() if not key.startswith("KRONK_")}
    env.update(KRONK_API_HOST=f"127.0.0.1:{port}", KRONK_BASE_PATH=str(tmp_path))
    cli = [sys.executable, "-m", "kronk_api.cli", "server"]
    started = subprocess.run(
        [*cli, "start", "-d", "--preload"], env=env, capture_output=True, text=True, timeout=120
    )
    assert started.returncode == 0, started.stderr
    # Long enough to outlast the start of the `stop` process on a loaded machine.
    body = {"model": DEFAULT_MODEL_ID, "prompt": "Count:", "max_tokens": 1000, "stream": True}
    body["logit_bias"] = NO_END
    chunks: list[str] = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as stream:
        lines = stream.iter_lines()
        for line in lines:
            if line.startswith("data: {"):
                chunks.append(line)
                break
        stop = subprocess.Popen(
            [*cli, "stop", "--timeout", "120"], env=env, stdout=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 60
        drained = None
        while time.monotonic() < deadline:
            try:
                answer = httpx.get(f"{url}/v1/readiness", timeout=10)
            except httpx.TransportError:  # gone already: the assertion below says so
                break
            if answer.status_code == 503:
                drained = answer.json()
                break
            time.sleep(0.05)
        assert drained is not None and drained["status"] == "draining"
        assert drained["load"]["slots_busy"] == 1
        chunks.extend(line for line in lines if line.startswith("data: {"))
    assert stop.wait(timeout=120) == 0
    # The stream ran to its end: max_tokens reached, not cut off by the stop.
    assert any('"finish_reason":"length"' in chunk.replace(" ", "") for chunk in chunks)
    assert not (tmp_path / "server.pid").exists()
