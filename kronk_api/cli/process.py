"""The server's process seen from outside: its pid file and log file under the base path,
whether a pid still runs Kronk, and a detached start that waits until the server is ready
(or says why it died)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import click

from kronk_api.settings import ServerSettings, Setting, environment_for


def pid_file_in(base: Path) -> Path:
    return base / "server.pid"


def log_file_in(base: Path) -> Path:
    return base / "logs" / "server.log"


def is_kronk_process(pid: int) -> bool:
    """True if pid is alive and runs kronk (a stale pid file may name a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not cmdline.exists():
        return True  # no /proc (macOS): trust the pid file
    arguments = cmdline.read_bytes().replace(b"\0", b" ")
    return b"kronk" in arguments and b"<defunct>" not in arguments


def start_detached(settings: ServerSettings, schema: list[Setting], ready_timeout: float) -> None:
    """Start a foreground server in the background; return once it answers, or say why not."""
    base = settings.base_path.expanduser()
    log_file = log_file_in(base)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    environment = {**os.environ, **environment_for(settings, schema)}
    environment.pop("KRONK_DETACH", None)  # the child must run in the foreground
    with log_file.open("ab") as sink:
        written = sink.tell()
        process = subprocess.Popen(
            [sys.executable, "-m", "kronk_api.cli", "server", "start"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=environment,
            start_new_session=True,
        )
    # A server on every interface is asked on loopback.
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "[::]": "[::1]"}.get(settings.host)
    readiness = f"http://{host or settings.host}:{settings.port}/v1/readiness"
    deadline = time.monotonic() + ready_timeout
    while not _ready(readiness):
        status = process.poll()
        if status is not None:
            why = "\n".join(_startup_errors(log_file, written))
            raise click.ClickException(
                f"the server exited (status {status}) before it was ready:\n{why}\nlog: {log_file}"
            )
        if time.monotonic() > deadline:
            raise click.ClickException(
                f"the server (pid {process.pid}) is not ready after {ready_timeout:g} s; it is "
                f"still starting (a large model loading?): `kronk server logs`, log: {log_file}"
            )
        time.sleep(0.2)
    click.echo(f"kronk server started in the background (pid {process.pid}) on {settings.api_host}")
    click.echo(f"logs: {log_file}")


# `kronk_core.contract.errors.ConfigError: mcp.listen: ...` in a traceback, its `|` margin aside.
EXCEPTION_LINE = re.compile(r"^[\s|]*([\w.]+(?:Error|Exception): .*)$", re.MULTILINE)


def _ready(readiness: str) -> bool:
    """True once the server answers its readiness route with 200 (the model preloaded)."""
    try:
        with urllib.request.urlopen(readiness, timeout=2) as answer:
            return bool(answer.status == 200)
    except (OSError, ValueError):  # not listening yet, still starting (a read timeout), or 503
        return False


def _startup_errors(log_file: Path, offset: int) -> list[str]:
    """What a server that died at start-up logged about why: its error lines (a JSON line's
    message, or the exception its traceback ends in), else its last lines."""
    with log_file.open("rb") as log:
        log.seek(offset)
        lines = log.read().decode(errors="replace").splitlines()
    errors = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            if line.strip():
                errors.append(line)  # click's `Error: ...`, a crash's traceback
            continue
        if isinstance(entry, dict) and entry.get("level") in ("ERROR", "CRITICAL"):
            # A failed start-up hook's message is a whole traceback: its exception says why.
            text = "\n".join(str(entry.get(key, "")) for key in ("msg", "exc"))
            raised = EXCEPTION_LINE.findall(text)
            errors.append(raised[-1].strip() if raised else text.strip().partition("\n")[0])
    return (errors or lines)[-8:]
