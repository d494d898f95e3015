"""A server that cannot start says why at once: real `kronk` processes on real ports."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from kronk_llamacpp.packaged import DEFAULT_MODEL_ID

CLI = [sys.executable, "-m", "kronk_api.cli"]


def _kronk(*args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess[str], float]:
    """The command's result and how long it took."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("KRONK_")}
    started = time.monotonic()
    result = subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=environment, timeout=timeout
    )
    return result, time.monotonic() - started


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    """A port another program listens on."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield other.getsockname()[1]


def test_a_taken_port_is_one_line_and_status_1_before_any_model_loads(tmp_path: Path) -> None:
    """--preload of a model that does not exist: the port is what the command reports."""
    with taken_port() as port:
        failed, seconds = _kronk(
            "server", "start", "--preload", "--model", "no-such-model",
            "--api-host", f"127.0.0.1:{port}", "--base-path", str(tmp_path),
        )  # fmt: skip
    assert failed.returncode == 1
    assert failed.stderr.splitlines() == [
        f"Error: cannot listen on 127.0.0.1:{port}: Address already in use"
        " (another server runs there: `kronk server stop`, or --api-host)"
    ]
    assert "no-such-model" not in failed.stdout + failed.stderr
    assert not (tmp_path / "server.pid").exists()
    # Within a second of what the command itself takes to start (its plugins' imports).
    started, start_up = _kronk("server", "start", "--help")
    assert started.returncode == 0
    assert seconds < start_up + 1.0, (seconds, start_up)


def test_a_model_that_cannot_preload_is_one_line_and_status_1(
    tmp_path: Path, port_finder: Callable[[], int]
) -> None:
    failed, _ = _kronk(
        "server", "start", "--preload", "--model", "no-such-model",
        "--api-host", f"127.0.0.1:{port_finder()}", "--base-path", str(tmp_path),
    )  # fmt: skip
    assert failed.returncode == 1
    (line,) = [line for line in failed.stderr.splitlines() if not line.startswith("{")]
    assert line.startswith("Error: model 'no-such-model' not found. Models here: "), line
    assert DEFAULT_MODEL_ID in line and "kronk model pull" in line
    assert "Traceback" not in failed.stderr


def test_detached_start_returns_once_the_server_is_ready(
    tmp_path: Path, port_finder: Callable[[], int]
) -> None:
    host = f"127.0.0.1:{port_finder()}"
    started, _ = _kronk(
        "server", "start", "-d", "--preload", "--api-host", host, "--base-path", str(tmp_path)
    )
    try:
        assert started.returncode == 0, started.stderr
        # No waiting here: the command returned once the model was loaded and the server up.
        ready = httpx.get(f"http://{host}/v1/readiness", timeout=10)
        loaded = {"status": "ready", "model": DEFAULT_MODEL_ID, "model_state": "loaded"}
        body = ready.json()
        assert body.pop("load")["slots_total"] >= 1  # the load: tests/test_affinity_drain.py
        assert body == loaded
        assert f"on {host}" in started.stdout
    finally:
        stopped, _ = _kronk("server", "stop", "--base-path", str(tmp_path))
    assert stopped.returncode == 0, stopped.stderr


@pytest.mark.parametrize("cause", ["taken port", "unknown model"])
def test_detached_start_that_fails_says_why(
    tmp_path: Path, port_finder: Callable[[], int], cause: str
) -> None:
    with taken_port() if cause == "taken port" else contextlib.nullcontext(port_finder()) as port:
        model = "no-such-model" if cause == "unknown model" else DEFAULT_MODEL_ID
        failed, _ = _kronk(
            "server", "start", "-d", "--preload", "--model", model,
            "--api-host", f"127.0.0.1:{port}", "--base-path", str(tmp_path),
        )  # fmt: skip
    assert failed.returncode == 1
    assert "Error: the server exited (status 1) before it was ready:" in failed.stderr
    why = "Address already in use" if cause == "taken port" else "'no-such-model' not found"
    assert why in failed.stderr
    assert f"log: {tmp_path / 'logs' / 'server.log'}" in failed.stderr
    assert not (tmp_path / "server.pid").exists()


# ---- log formats ------------------------------------------------------------------------------


def _start_up_log(tmp_path: Path, port: int, terminal: bool, *flags: str) -> list[str]:
    """The log lines of a real server's start, written to a terminal (a pty) or a pipe."""
    primary, secondary = pty.openpty() if terminal else os.pipe()
    environment = {key: value for key, value in os.environ.items() if not key.startswith("KRONK_")}
    command = [*CLI, "server", "start", "--api-host", f"127.0.0.1:{port}", *flags]
    process = subprocess.Popen(
        [*command, "--base-path", str(tmp_path)],
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=secondary,
        env=environment,
    )
    os.close(secondary)
    output = b""
    try:
        deadline = time.monotonic() + 120
        while b"Application startup complete" not in output:
            assert time.monotonic() < deadline and process.poll() is None, output
            if select.select([primary], [], [], 1)[0]:
                output += os.read(primary, 65536)
    finally:
        process.terminate()
        process.wait(timeout=30)
        os.close(primary)
    return [line for line in output.decode().splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("terminal", "flags", "as_json"),
    [(True, [], False), (False, [], True), (True, ["--log-format", "json"], True),
     (False, ["--log-format", "text"], False)],
    ids=["terminal", "pipe", "terminal-asked-json", "pipe-asked-text"],
)  # fmt: skip
def test_logs_are_text_on_a_terminal_json_elsewhere_or_as_asked(
    tmp_path: Path, port_finder: Callable[[], int], terminal: bool, flags: list[str], as_json: bool
) -> None:
    lines = _start_up_log(tmp_path, port_finder(), terminal, *flags)
    assert any("Application startup complete" in line for line in lines), lines
    for line in lines:
        if as_json:
            entry = json.loads(line)
            stamp, level, logger = entry["time"], entry["level"], entry["logger"]
        else:
            assert not line.startswith("{"), line
            stamp, level, logger, _ = line.split(maxsplit=3)
            logger = logger.removesuffix(":")
        assert level in ("DEBUG", "INFO", "WARNING", "ERROR"), line
        assert logger and " " not in logger, line
        written = datetime.fromisoformat(stamp)  # ISO 8601, with the UTC offset
        assert written.tzinfo is not None, line
        assert abs(time.time() - written.timestamp()) < 300, line
