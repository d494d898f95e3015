"""Request ids on responses and in JSON log lines; no token ever in the log file."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from kronk_api.logs import JsonFormatter, request_id
from kronk_llamacpp.packaged import DEFAULT_MODEL_ID
from kronk_testing.cli import kronk_at

if TYPE_CHECKING:
    from kronk_testing.server import RunningServer


def test_request_id_is_echoed_or_made(server: RunningServer) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        given = client.get("/v1/liveness", headers={"X-Request-ID": "abc-123"})
        made = client.get("/v1/liveness")
    assert given.headers["x-request-id"] == "abc-123"
    assert len(made.headers["x-request-id"]) == 32


def test_json_log_line_carries_the_request_id() -> None:
    record = logging.LogRecord("kronk", logging.INFO, __file__, 1, 'said "%s"', ("hi",), None)
    token = request_id.set("req-7")
    try:
        line = json.loads(JsonFormatter().format(record))
    finally:
        request_id.reset(token)
    assert line["msg"] == 'said "hi"'
    assert line["request_id"] == "req-7"
    assert line["level"] == "INFO" and line["logger"] == "kronk"


# ---- the log file of a real server ---------------------------------------------------------


@contextlib.contextmanager
def detached_server(base: Path, host: str, *flags: str) -> Iterator[str]:
    """`kronk server start -d` on `host`, ready; stopped (killed if need be) on leaving."""
    started = kronk_at(base, "server", "start", "-d", "--api-host", host, *flags)
    assert started.returncode == 0, started.stderr
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://{host}/v1/readiness", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            log = base / "logs" / "server.log"
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.2)
        yield f"http://{host}"
    finally:
        stopped = kronk_at(base, "server", "stop")
        pid_file = base / "server.pid"
        if stopped.returncode != 0 and pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


@pytest.fixture
def logged_server(tmp_path: Path, port_finder: Callable[[], int]) -> Iterator[str]:
    """`kronk server start -d` with auth, debug logs and insecure logging: all a log could hold."""
    models = tmp_path / "models.yaml"
    models.write_text(
        f"models:\n  {DEFAULT_MODEL_ID}:\n    context_window: 512\n    n_seq_max: 1\n"
    )
    flags = ["--model-config-file", str(models), "--preload"]
    flags += ["--auth-enabled", "--insecure-logging", "--log-level", "debug"]
    with detached_server(tmp_path, f"127.0.0.1:{port_finder()}", *flags) as base_url:
        yield base_url


def test_bearer_tokens_never_reach_the_log_file(logged_server: str, tmp_path: Path) -> None:
    admin = (tmp_path / "keys" / "master.jwt").read_text()
    with httpx.Client(base_url=logged_server, timeout=120) as http:
        minted = http.post(
            "/v1/kronk/security/tokens",
            json={"duration": "1h", "endpoints": "chat-completions,messages"},
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert minted.status_code == 201, minted.text
        user = minted.json()["token"]
        forged = user[:-4] + ("AAAA" if not user.endswith("AAAA") else "BBBB")
        chat = {
            "model": DEFAULT_MODEL_ID,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
        }
        asked = [
            (user, "Bearer", "/v1/chat/completions", chat, 200),
            (user, "x-api-key", "/v1/messages", chat, 200),
            (user, "Bearer", "/v1/chat/completions", {**chat, "model": "no-such-model"}, 404),
            (forged, "Bearer", "/v1/chat/completions", chat, 401),
            (forged, "x-api-key", "/v1/messages", chat, 401),
            (f"{user} trailing", "Bearer", "/v1/chat/completions", chat, 401),
            (user, "Token", "/v1/chat/completions", chat, 401),
            (user, "Bearer", "/v1/kronk/slots", None, 403),
            (admin, "Bearer", "/v1/kronk/security/keys", None, 200),
        ]
        for token, scheme, path, body, status in asked:
            headers = (
                {"x-api-key": token}
                if scheme == "x-api-key"
                else {"Authorization": f"{scheme} {token}"}
            )
            response = (
                http.get(path, headers=headers)
                if body is None
                else http.post(path, json=body, headers=headers)
            )
            assert response.status_code == status, (path, scheme, response.text)
    kronk_at(tmp_path, "server", "stop")

    log = (tmp_path / "logs" / "server.log").read_text(errors="replace")
    # The log did record these requests, their bodies included (insecure logging).
    assert "/v1/chat/completions" in log and "request body:" in log, log
    for token in (admin, user, forged):
        for part in (token, *token.split(".")[1:]):  # whole, or its claims or signature alone
            assert part not in log, part


def test_one_request_id_from_the_client_to_the_engine_and_the_access_log(
    tmp_path: Path, port_finder: Callable[[], int]
) -> None:
    """A real `kronk server start`: the client's X-Request-ID is on the dialect's, the
    engine thread's and uvicorn's access log lines of that request, and on no other."""
    flags = ["--preload", "--log-level", "debug", "--debug-host", f"127.0.0.1:{port_finder()}"]
    with detached_server(tmp_path, f"127.0.0.1:{port_finder()}", *flags) as base_url:
        chat = {
            "model": DEFAULT_MODEL_ID,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3,
        }
        answer = httpx.post(
            f"{base_url}/v1/chat/completions",
            json=chat,
            headers={"X-Request-ID": "e2e-4242"},
            timeout=120,
        )
        assert answer.status_code == 200 and answer.headers["x-request-id"] == "e2e-4242"
        assert httpx.get(f"{base_url}/v1/liveness").status_code == 200
    log = (tmp_path / "logs" / "server.log").read_text()
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    ours = [line for line in lines if line.get("request_id") == "e2e-4242"]
    by_logger = {line["logger"]: line["msg"] for line in ours}
    finished = by_logger["kronk_core.runtime.engine"]
    assert finished.startswith("finished (length): 3 completion tokens")
    assert any(line["msg"].startswith("started in slot") for line in ours)
    assert "POST /v1/chat/completions" in by_logger["uvicorn.access"]
    # The liveness check had an id of its own.
    liveness = [line for line in lines if "GET /v1/liveness" in line["msg"]]
    assert liveness and all(line["request_id"] != "e2e-4242" for line in liveness)
