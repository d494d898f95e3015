"""The manual's HTTP timeouts on a real uvicorn over TCP: read (a slow body is 408), idle
(keep-alive connections close), write (a client that stops reading is dropped and its
generation cancelled) and shutdown (running streams drain, then are cancelled)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from kronk_api import ServerSettings, create_app
from kronk_api.timeouts import HttpTimeouts
from kronk_core import Kronk
from kronk_llamacpp.packaged import GEMMA_MODEL_ID
from kronk_testing.server import free_port, serving
from kronk_testing.waiting import reached

PROMPT = "Write a very long story about a lighthouse keeper and the sea."


def _app(kronk: Kronk, read: float = 30.0, write: float = 900.0) -> HttpTimeouts:
    return HttpTimeouts(create_app(ServerSettings(), kronk=kronk), read, write)


def _address(base_url: str) -> tuple[str, int]:
    host, port = base_url.removeprefix("http://").split(":")
    return host, int(port)


def _until_closed(client: socket.socket) -> bytes:
    """All the server sends until it closes the connection (10 s at most)."""
    client.settimeout(10)
    answer = b""
    while chunk := client.recv(65536):
        answer += chunk
    return answer


def _slots_free(kronk: Kronk) -> bool:
    loaded = kronk.get_loaded(GEMMA_MODEL_ID)
    assert loaded is not None
    return not any(state.busy or state.pending for state in loaded.engine.slot_states())


def _chat(stream: bool, max_tokens: int) -> bytes:
    return json.dumps(
        {
            "model": GEMMA_MODEL_ID,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": stream,
        }
    ).encode()


def test_a_slow_body_is_408_and_closed(kronk: Kronk) -> None:
    with serving(_app(kronk, read=1.0), lifespan="off") as base_url:
        body = _chat(False, 4)
        # Timed from before the connection: the server's 1 s cannot start earlier.
        started = time.monotonic()
        with socket.create_connection(_address(base_url)) as client:
            client.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body[:10]
            )
            answer = _until_closed(client)
            waited = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert b"request_timeout" in answer
        assert 0.95 < waited < 30  # and the server closed the connection (recv gave b"")
        # A body sent in time is served.
        response = httpx.post(f"{base_url}/v1/chat/completions", content=body, timeout=60)
        assert response.status_code == 200


def test_an_idle_keep_alive_connection_is_closed(kronk: Kronk) -> None:
    with (
        serving(_app(kronk), lifespan="off", timeout_keep_alive=1) as base_url,
        socket.create_connection(_address(base_url)) as client,
    ):
        started = time.monotonic()  # before the request: the idle 1 s starts after it
        client.sendall(b"GET /v1/liveness HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = _until_closed(client)  # closed by the server, not by us
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"}")
        assert 0.95 < time.monotonic() - started < 30


def test_a_client_that_stops_reading_is_dropped_and_its_generation_cancelled(
    kronk: Kronk,
) -> None:
    with serving(_app(kronk, write=1.0), lifespan="off", send_buffer=8192) as base_url:
        client = socket.socket()
        # A small receive window: the server's buffers fill after a few hundred tokens.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(_address(base_url))
        body = _chat(True, 3000)
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        client.settimeout(60)
        assert client.recv(64).startswith(b"HTTP/1.1 200 ")
        assert reached(lambda: not _slots_free(kronk), 10)
        # The client reads nothing more: the server drops it once its sends wait 1 s,
        # long before 3000 tokens, and the generation stops with it.
        assert reached(lambda: _slots_free(kronk), 60)
        client.settimeout(10)
        try:
            while client.recv(65536):
                pass
            dropped = True  # what was buffered, then the end
        except ConnectionResetError:
            dropped = True
        client.close()
        assert dropped


def test_shutdown_drains_streams_then_cancels_them(kronk: Kronk) -> None:
    outcomes: dict[str, str] = {}
    answering = {"short": threading.Event(), "long": threading.Event()}

    def stream(name: str, base_url: str, max_tokens: int) -> None:
        try:
            with httpx.stream(
                "POST",
                f"{base_url}/v1/chat/completions",
                content=_chat(True, max_tokens),
                headers={"Content-Type": "application/json"},
                timeout=60,
            ) as response:
                answering[name].set()
                text = "".join(response.iter_text())
            outcomes[name] = "finished" if "[DONE]" in text else "cut"
        except httpx.HTTPError:
            outcomes[name] = "cut"

    with serving(_app(kronk), lifespan="off", timeout_graceful_shutdown=5) as base_url:
        threads = [
            threading.Thread(target=stream, args=("short", base_url, 8)),
            threading.Thread(target=stream, args=("long", base_url, 3000)),
        ]
        for thread in threads:
            thread.start()
        # Both are being answered (a request the server has not read yet is not drained).
        assert all(event.wait(60) for event in answering.values())
        stopping = time.monotonic()
    # Leaving `serving` stopped the server: the short stream finished in the drain, the
    # long one was cancelled after the shutdown timeout (5 s), and its slot freed.
    for thread in threads:
        thread.join(30)
    assert outcomes == {"short": "finished", "long": "cut"}
    assert time.monotonic() - stopping < 30
    assert reached(lambda: _slots_free(kronk), 10)


def test_kronk_server_start_serves_with_the_manuals_timeouts(tmp_path: Path) -> None:
    """A real `kronk server start -d`, its read and idle timeouts from the manual's
    variables (which reach the detached child), the shutdown timeout from its flag."""
    port = free_port()
    base = str(tmp_path / "home")
    env = {key: value for key, value in os.environ.items() if not key.startswith("KRONK_")}
    env.update(KRONK_WEB_READ_TIMEOUT="1s", KRONK_WEB_IDLE_TIMEOUT="1s")
    cli = [sys.executable, "-m", "kronk_api.cli", "server"]
    common = ["--base-path", base]
    started = subprocess.run(
        [*cli, "start", "-d", f"--api-host=127.0.0.1:{port}", "--shutdown-timeout=2s", *common],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 0, started.stderr
    try:
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(b"GET /v1/liveness HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _until_closed(client).startswith(b"HTTP/1.1 200 ")  # the idle timeout
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
            )
            assert _until_closed(client).startswith(b"HTTP/1.1 408 ")
    finally:
        stopped = subprocess.run(
            [*cli, "stop", *common], env=env, capture_output=True, text=True, timeout=60
        )
        assert stopped.returncode == 0, stopped.stderr
