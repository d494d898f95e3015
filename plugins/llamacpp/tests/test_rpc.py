"""One model's layers spread over two llama.cpp RPC workers on loopback (`rpc_servers`).

Real parts throughout: the shared `kronk libs --rpc` build (kronk_libs_build.py, beside this file),
two `kronk rpc start` workers (ggml-rpc-server), a `kronk server start` that loads those
libraries, and the default model. The spread model answers the same greedy tokens as the
same model in one process; a worker that is down, or dies, is a clear error, never a hang.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from kronk_core.contract.errors import BackendUnavailableError
from kronk_llamacpp.endpoint import Endpoint
from kronk_llamacpp.libs import worker_name
from kronk_llamacpp.packaged import default_model_path
from kronk_llamacpp.rpc import handshake
from kronk_testing.libs_build import LIBS, USE_IT, build, kronk
from kronk_testing.server import free_port
from kronk_testing.waiting import reached

KRONK = (sys.executable, "-m", "kronk_api.cli")
CHAT = "/v1/chat/completions"
QUESTION = [{"role": "user", "content": "Name three colours of the rainbow."}]
# Greedy, the model counts on for as long as it may: a request still running when a worker dies.
LONG = [{"role": "user", "content": "Count from 1 to 400, separated by commas."}]


def _listening(port: int) -> bool:
    """A TCP connection is accepted (a worker takes it as a client that leaves at once)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _keepalive_seconds(port: int) -> list[float]:
    """Seconds to the next keepalive probe of each established connection to `port` (the
    kernel's table: timer 2 on an idle connection is its keepalive timer)."""
    found = []
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = row.split()
        remote_port = int(fields[2].split(":")[1], 16)
        timer, ticks = fields[5].split(":")
        if remote_port == port and fields[3] == "01" and timer == "02":
            found.append(int(ticks, 16) / os.sysconf("SC_CLK_TCK"))
    return found


def _rss(pid: int) -> int:
    """The process's resident memory in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@dataclass
class Worker:
    port: int
    process: subprocess.Popen[bytes]

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    workers: list[Worker]

    def chat(self, model: str, messages: list[dict[str, str]], **extra: Any) -> httpx.Response:
        body = {"model": model, "messages": messages, "temperature": 0, "max_tokens": 24}
        return httpx.post(self.url + CHAT, json={**body, **extra}, timeout=300)


@pytest.fixture(scope="module")
def rpc_build() -> None:
    built = build()
    assert built.returncode == 0, built.stdout + built.stderr


def _start_worker(port: int, log: Path) -> Worker:
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [*KRONK, "rpc", "start", "--listen", f"127.0.0.1:{port}", "--threads", "1"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, **USE_IT},
        )
    assert reached(lambda: _listening(port) or process.poll() is not None, 120)
    assert process.poll() is None, log.read_text()
    return Worker(port, process)


@pytest.fixture
def spread(rpc_build: None, tmp_path: Path) -> Iterator[Server]:
    """Two workers and a server whose models are: `spread` on both workers, `local` (the same
    file, in the server's process) and `unreachable` (a worker nobody runs)."""
    workers = [_start_worker(free_port(), tmp_path / f"worker{n}.log") for n in (1, 2)]
    model = default_model_path()
    servers = ", ".join(worker.endpoint for worker in workers)
    common = f"    model_path: {model}\n    context_window: 2048\n    n_seq_max: 1\n"
    (tmp_path / "models.yaml").write_text(
        f"models:\n  spread:\n{common}    rpc_servers: [{servers}]\n"
        f"  local:\n{common}"
        # llama-server's spelling: one comma-separated string.
        f"  unreachable:\n{common}    rpc: 127.0.0.1:{free_port()}\n",
        encoding="utf-8",
    )
    host = f"127.0.0.1:{free_port()}"
    env = {key: value for key, value in os.environ.items() if not key.startswith("KRONK_")}
    env.update(
        USE_IT,
        KRONK_API_HOST=host,
        KRONK_BASE_PATH=str(tmp_path / "base"),
        KRONK_MODEL_CONFIG_FILE=str(tmp_path / "models.yaml"),
        KRONK_MODEL="spread",
    )
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [*KRONK, "server", "start"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    server = Server(f"http://{host}", process, log, workers)
    try:
        assert reached(lambda: _liveness(server) or process.poll() is not None, 120)
        assert process.poll() is None, log.read_text()
        yield server
    finally:
        for child in [process, *(worker.process for worker in workers)]:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=30)


def _liveness(server: Server) -> bool:
    try:
        return httpx.get(server.url + "/v1/liveness", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def _tokens(answer: httpx.Response) -> list[str]:
    return [entry["token"] for entry in answer.json()["choices"][0]["logprobs"]["content"]]


def test_a_model_spread_over_two_workers_answers_as_one_process(spread: Server) -> None:
    before = [_rss(worker.process.pid) for worker in spread.workers]
    local = spread.chat("local", QUESTION, logprobs=True)
    assert local.status_code == 200, local.text
    answer = spread.chat("spread", QUESTION, logprobs=True)
    assert answer.status_code == 200, answer.text + spread.log.read_text()
    assert _tokens(answer) == _tokens(local) and len(_tokens(local)) > 3
    text = answer.json()["choices"][0]["message"]["content"]
    assert text == local.json()["choices"][0]["message"]["content"]
    # llama.cpp's connections to the workers probe them when idle (a worker host that
    # vanishes fails them in bounded time); a delayed ACK's timer is far shorter.
    for worker in spread.workers:
        assert [seconds > 1 for seconds in _keepalive_seconds(worker.port)] == [True]
    # Each worker holds a share of the layers: a third of the file at the least.
    grown = [_rss(w.process.pid) - rss for w, rss in zip(spread.workers, before, strict=True)]
    assert all(size > default_model_path().stat().st_size / 3 for size in grown), grown

    # A worker serves one client: a second Kronk would be refused, not left waiting.
    with pytest.raises(BackendUnavailableError, match="did not answer within 2 s"):
        handshake(Endpoint.parse(spread.workers[0].endpoint), timeout=2)

    # A worker nobody runs: the load is refused with its address, at once.
    down = spread.chat("unreachable", QUESTION)
    assert down.status_code == 503, down.text
    error = down.json()["error"]
    assert error["code"] == "backend_unavailable"
    assert "cannot be reached: Connection refused" in error["message"]
    assert "kronk rpc start" in error["message"]

    # One worker dies while the model is idle: its next request is a 503 naming it, the
    # model's engine stops (readiness says so), the process and its other models go on.
    lost = spread.workers[1]
    lost.process.kill()
    lost.process.wait(timeout=30)
    after = spread.chat("spread", QUESTION)
    assert after.status_code == 503, after.text
    error = after.json()["error"]
    assert error["code"] == "backend_lost"
    assert f"RPC worker {lost.endpoint} of spread closed its connection" in error["message"]
    again = spread.chat("spread", QUESTION)
    assert again.status_code == 503 and again.json()["error"]["code"] == "backend_lost"
    ready = httpx.get(spread.url + "/v1/readiness", timeout=10)
    assert ready.status_code == 503, ready.text
    assert ready.json()["model_state"] == "stopped"
    still = spread.chat("local", QUESTION, logprobs=True)
    assert still.status_code == 200 and _tokens(still) == _tokens(local)

    # It stops cleanly: the lost model's buffers on the dead worker are never freed, which
    # would make ggml abort.
    spread.process.send_signal(signal.SIGTERM)
    # uvicorn ends by raising the signal again once it shut down; an abort would be SIGABRT.
    assert spread.process.wait(timeout=60) == -signal.SIGTERM, spread.log.read_text()
    assert "unloaded spread at shutdown" in spread.log.read_text()


def test_a_worker_killed_mid_answer_ends_the_request_not_hangs(spread: Server) -> None:
    """ggml's client aborts the process when a connection breaks during a decode; between
    decodes Kronk sees it first. Either way the request ends, saying why."""
    body = {"model": "spread", "messages": LONG, "temperature": 0, "max_tokens": 1500}
    body["stream"] = True
    received = b""
    ended_by = ""
    with httpx.stream("POST", spread.url + CHAT, json=body, timeout=60) as stream:
        assert stream.status_code == 200
        chunks = stream.iter_raw()
        while received.count(b"data:") < 5:
            received += next(chunks)
        spread.workers[0].process.kill()
        try:
            for chunk in chunks:
                received += chunk
        except httpx.TransportError as exc:
            ended_by = type(exc).__name__
    if ended_by:  # llama.cpp aborted: the process ended and said why
        code = spread.process.wait(timeout=60)
        assert code == -signal.SIGABRT
        log = spread.log.read_text()
        assert "llama.cpp is ending this process" in log
        assert spread.workers[0].endpoint in log
    else:  # Kronk saw the closed connection before a decode
        assert b"backend_lost" in received and b"closed its connection" in received
        assert spread.process.poll() is None


def test_rpc_start_without_a_worker_in_the_build_says_how_to_build_one(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "kronk-libs.json").write_text("{}")
    refused = kronk("rpc", "start", "--processor", "cpu", "--lib-path", str(tmp_path))
    assert refused.returncode == 1
    assert f"the cpu build in {tmp_path / 'cpu'} has no RPC worker" in refused.stderr
    assert "kronk libs --processor cpu --rpc" in refused.stderr
    nothing = kronk("rpc", "start", "--processor", "cuda", "--lib-path", str(tmp_path))
    assert f"no cuda build in {tmp_path / 'cuda'}" in nothing.stderr
    ipv6 = kronk("rpc", "start", "--listen", "[::1]:50052", "--lib-path", str(LIBS))
    assert ipv6.returncode == 1 and "expected HOST:PORT" in ipv6.stderr
    named = kronk("rpc", "start", "--listen", "localhost:50052", "--lib-path", str(LIBS))
    assert "the worker listens on an IPv4 address" in named.stderr


def test_rpc_start_refuses_a_taken_port(rpc_build: None) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = kronk(
            "rpc", "start", "--listen", f"127.0.0.1:{port}", "--lib-path", str(LIBS), env=USE_IT
        )
    assert refused.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in refused.stderr
    assert (LIBS / "cpu" / worker_name()).is_file()
