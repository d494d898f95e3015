"""Limits on connections (kronk_api.connections) on a real uvicorn over raw sockets: request
headers get a deadline (read_header_timeout), one client address a number of connections
(max_connections_per_client), a request's headers a size (max_header_bytes)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from kronk_api import ServerSettings, create_app
from kronk_api.connections import LINGER_SECONDS, ConnectionGuard
from kronk_api.timeouts import HttpTimeouts
from kronk_testing.server import free_port, serving
from kronk_testing.waiting import reached

MakeKronk = Callable[..., Any]
LIVENESS = b"GET /v1/liveness HTTP/1.1\r\nHost: x\r\n\r\n"
# What the deadlines here may take beyond their own length on a loaded machine.
MARGIN = 10.0


@contextmanager
def guarded(
    make_kronk: MakeKronk,
    header_timeout: float = 30.0,
    per_client: int = 256,
    header_bytes: int = 32 << 10,
) -> Iterator[tuple[tuple[str, int], ConnectionGuard]]:
    """A server (no model: liveness answers) under a ConnectionGuard, as `kronk server start`
    runs one; yields its address and the guard."""
    guard = ConnectionGuard(header_timeout, per_client, header_bytes)
    app = HttpTimeouts(create_app(ServerSettings(), kronk=make_kronk()), 30.0, 900.0)
    options = guard.uvicorn_options()
    with serving(app, lifespan="off", timeout_keep_alive=60, **options) as base_url:
        host, port = base_url.removeprefix("http://").split(":")
        yield (host, int(port)), guard


def _response(client: socket.socket) -> bytes:
    """One response (headers and a Content-Length body) from a kept-alive connection."""
    client.settimeout(30)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = client.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = client.recv(65536)
        assert chunk
        body += chunk
    return head + b"\r\n\r\n" + body


def _trickle_until_closed(client: socket.socket, seconds: float) -> tuple[bytes, float]:
    """Send one byte of a header line whenever the server has said nothing for 0.3 s, until
    it closes the connection; what it sent and when it closed (time.monotonic()). Fails
    after `seconds`."""
    deadline = time.monotonic() + seconds
    answer = b""
    client.settimeout(0.3)
    while time.monotonic() < deadline:
        try:
            chunk = client.recv(65536)
        except TimeoutError:
            try:
                client.send(b"x")
            except (BrokenPipeError, ConnectionResetError):
                return answer, time.monotonic()
            continue
        except ConnectionResetError:
            return answer, time.monotonic()
        if not chunk:
            return answer, time.monotonic()
        answer += chunk
    raise AssertionError(f"still open after {seconds} s; received {answer!r}")


def _error(answer: bytes) -> dict[str, Any]:
    error: dict[str, Any] = json.loads(answer.partition(b"\r\n\r\n")[2])["error"]
    return error


def test_headers_that_trickle_are_cut_at_the_deadline(make_kronk: MakeKronk) -> None:
    with guarded(make_kronk, header_timeout=1.0) as (address, _):
        started = time.monotonic()  # before connecting: the server's 1 s cannot start earlier
        with (
            socket.create_connection(address) as slow,
            socket.create_connection(address) as silent,
        ):
            slow.sendall(b"GET /v1/liveness HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            answer, closed = _trickle_until_closed(slow, 1.0 + MARGIN)
            assert 0.95 < closed - started < 1.0 + MARGIN
            assert answer.startswith(b"HTTP/1.1 408 ")
            assert b"connection: close" in answer.lower()
            error = _error(answer)
            assert error["code"] == "request_timeout"
            assert "read_header_timeout" in error["message"]
            # A connection that sent nothing at all is closed without a word.
            silent.settimeout(1.0 + MARGIN)
            assert silent.recv(65536) == b""
        # A request sent in time is served.
        with socket.create_connection(address) as client:
            client.sendall(LIVENESS)
            assert _response(client).startswith(b"HTTP/1.1 200 ")


def test_a_kept_alive_connection_may_idle_and_its_next_request_has_the_deadline(
    make_kronk: MakeKronk,
) -> None:
    with (
        guarded(make_kronk, header_timeout=1.0) as (address, _),
        socket.create_connection(address) as client,
    ):
        client.sendall(LIVENESS)
        assert _response(client).startswith(b"HTTP/1.1 200 ")
        # Idle for longer than the header deadline: the idle timeout (60 s) governs.
        client.settimeout(2.5)
        try:
            closed_early = client.recv(1) == b""
        except TimeoutError:
            closed_early = False
        assert not closed_early
        client.sendall(LIVENESS)
        assert _response(client).startswith(b"HTTP/1.1 200 ")
        # The next request's first byte starts its deadline again.
        started = time.monotonic()
        client.sendall(b"GET /v1/liveness HTTP/1.1\r\nHo")
        answer, closed = _trickle_until_closed(client, 1.0 + MARGIN)
        assert 0.95 < closed - started < 1.0 + MARGIN
        assert answer.startswith(b"HTTP/1.1 408 ")


def test_connections_beyond_the_cap_are_refused_until_some_close(make_kronk: MakeKronk) -> None:
    cap = 3
    with guarded(make_kronk, per_client=cap) as (address, guard), ExitStack() as stack:
        held = [stack.enter_context(socket.create_connection(address)) for _ in range(cap)]
        assert reached(lambda: guard.open["127.0.0.1"] == cap, 10)
        with socket.create_connection(address) as extra:
            answer, _ = _trickle_until_closed(extra, LINGER_SECONDS + MARGIN)
        assert answer.startswith(b"HTTP/1.1 429 ")
        assert b"retry-after: 1" in answer.lower()
        error = _error(answer)
        assert "max_connections_per_client" in error["message"]
        # The connections within the cap still work, kept alive.
        for client in held:
            client.sendall(LIVENESS)
            assert _response(client).startswith(b"HTTP/1.1 200 ")
        held.pop().close()
        assert reached(lambda: guard.open["127.0.0.1"] == cap - 1, 10)
        with socket.create_connection(address) as client:
            client.sendall(LIVENESS)
            assert _response(client).startswith(b"HTTP/1.1 200 ")


def test_oversized_headers_are_a_json_400_not_a_reset(make_kronk: MakeKronk) -> None:
    with guarded(make_kronk, header_bytes=8192) as (address, _):
        base_url = f"http://{address[0]}:{address[1]}"
        # However the headers arrive: in one piece (complete, then measured), or in two of
        # which the first is already past the limit (h11's bound on headers still coming).
        big = b"GET /v1/liveness HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000
        for pieces in ([big + b"\r\n\r\n"], [big, b"\r\n\r\n"]):
            with socket.create_connection(address) as client:
                for piece in pieces:
                    client.sendall(piece)
                answer, _ = _trickle_until_closed(client, LINGER_SECONDS + MARGIN)
            assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
            error = _error(answer)
            assert error["code"] == "limit_exceeded"
            assert "max_header_bytes" in error["message"] and "8192" in error["message"]
        # An HTTP client sending 100 KB of headers reads the answer (no reset).
        response = httpx.get(f"{base_url}/v1/liveness", headers={"X-Big": "a" * 100_000})
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "limit_exceeded"
        assert httpx.get(f"{base_url}/v1/liveness", headers={"X-Fits": "a" * 4000}).is_success


def test_kronk_server_start_has_the_connection_limits(tmp_path: Path) -> None:
    """`kronk server start` runs the guarded protocol with its settings' values."""
    port = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("KRONK_")}
    env.update(KRONK_READ_HEADER_TIMEOUT="1s", KRONK_MAX_CONNECTIONS_PER_CLIENT="2")
    cli = [sys.executable, "-m", "kronk_api.cli", "server"]
    common = ["--base-path", str(tmp_path / "home")]
    started = subprocess.run(
        [*cli, "start", "-d", f"--api-host=127.0.0.1:{port}", "--max-header-bytes=2048", *common],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 0, started.stderr
    try:
        address = ("127.0.0.1", port)
        with socket.create_connection(address) as first:
            first.sendall(b"GET /v1/liveness HTTP/1.1\r\nHost: x\r\n")
            answer, _ = _trickle_until_closed(first, 1.0 + MARGIN)
            assert answer.startswith(b"HTTP/1.1 408 ")
        with socket.create_connection(address) as big:
            big.sendall(LIVENESS[:-2] + b"X-Big: " + b"a" * 3000 + b"\r\n\r\n")
            answer, _ = _trickle_until_closed(big, LINGER_SECONDS + MARGIN)
            assert b"max_header_bytes" in answer
        with ExitStack() as stack:
            for _ in range(2):
                client = stack.enter_context(socket.create_connection(address))
                client.sendall(LIVENESS)
                assert _response(client).startswith(b"HTTP/1.1 200 ")
            with socket.create_connection(address) as extra:
                answer, _ = _trickle_until_closed(extra, LINGER_SECONDS + MARGIN)
            assert answer.startswith(b"HTTP/1.1 429 ")
    finally:
        stopped = subprocess.run(
            [*cli, "stop", *common], env=env, capture_output=True, text=True, timeout=60
        )
        assert stopped.returncode == 0, stopped.stderr
