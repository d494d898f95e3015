"""The command line as a user runs it: `kronk server start` (embedded) and `kronk mcp start`.

Each runs as a subprocess with the Kronk manual's environment variables.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from kronk_testing.server import free_port

if TYPE_CHECKING:
    from kronk_testing.brave_search import BraveSearchDouble

CLI = [sys.executable, "-m", "kronk_api.cli"]


def environment(**extra: str) -> dict[str, str]:
    """This environment without KRONK_* or MCP_* variables, plus `extra`."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("KRONK_", "MCP_"))}
    return {**kept, **extra}


def kronk(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def wait_listening(port: int, process: subprocess.Popen[str] | None = None) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"exited with {process.returncode}: {process.communicate()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 1).close()
    except ConnectionRefusedError:
        return True
    return False


@contextlib.contextmanager
def running(args: list[str], env: dict[str, str], port: int) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [*CLI, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_listening(port, process)
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        process.communicate(timeout=30)


async def search(url: str, query: str, token: str | None = None) -> types.CallToolResult:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):
        return await client.call_tool("web_search", {"query": query, "count": 2})


def test_kronk_server_start_runs_the_service_with_the_manuals_variables(
    tmp_path: Path, brave: BraveSearchDouble
) -> None:
    api, mcp = free_port(), free_port()
    env = environment(
        KRONK_MCP_BRAVEAPIKEY=brave.key,
        KRONK_MCP_LISTEN=f"127.0.0.1:{mcp}",
        KRONK_MCP_BRAVE_URL=brave.base_url,
    )
    base = ["--base-path", str(tmp_path)]
    created = kronk(
        "security", "token", "create", "--local", *base,
        "--duration", "1h", "--endpoints", "mcp:1/day", env=env,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    user_token = created.stdout.strip()
    args = ["server", "start", *base, "--api-host", f"127.0.0.1:{api}", "--auth-jwt-enabled"]
    with running(args, env, mcp) as server:
        url = f"http://127.0.0.1:{mcp}"
        anonymous = httpx.post(url, json={})
        found = asyncio.run(search(url, "first", user_token))
        over_quota = httpx.post(
            url,
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {}},
            headers={"Authorization": f"Bearer {user_token}"},
        )
    assert server.returncode == 0
    assert anonymous.status_code == 401
    assert not found.is_error and brave.requests[0].params["q"] == "first"
    assert over_quota.status_code == 429
    assert refused(mcp)


def test_a_detached_server_keeps_the_key_given_as_a_flag(
    tmp_path: Path, brave: BraveSearchDouble
) -> None:
    """The detached child gets its settings as KRONK_* variables: the key must survive that."""
    api, mcp = free_port(), free_port()
    env = environment(KRONK_BASE_PATH=str(tmp_path))
    started = kronk(
        "server", "start", "-d", "--api-host", f"127.0.0.1:{api}",
        "--mcp-listen", f"127.0.0.1:{mcp}", "--mcp-braveapikey", brave.key,
        "--mcp-brave-url", brave.base_url, env=env,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        wait_listening(mcp)
        found = asyncio.run(search(f"http://127.0.0.1:{mcp}", "detached"))
    finally:
        stopped = kronk("server", "stop", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert not found.is_error, found.content
    assert brave.requests[0].headers["X-Subscription-Token"] == brave.key
    assert brave.key not in (tmp_path / "logs" / "server.log").read_text()


def test_kronk_mcp_start_reads_the_standalone_variables(brave: BraveSearchDouble) -> None:
    port = free_port()
    env = environment(
        MCP_MCP_HOST=f"127.0.0.1:{port}",
        MCP_MCP_BRAVEAPIKEY=brave.key,
        KRONK_MCP_BRAVEAPIKEY="the-embedded-services-key",  # the standalone one wins
        KRONK_MCP_BRAVE_URL=brave.base_url,
    )
    with running(["mcp", "start"], env, port) as service:
        found = asyncio.run(search(f"http://127.0.0.1:{port}", "standalone"))
    assert service.returncode == 0
    assert not found.is_error, found.content
    assert brave.requests[0].headers["X-Subscription-Token"] == brave.key
    assert refused(port)


def test_kronk_mcp_start_refuses_an_address_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        result = kronk("mcp", "start", "--mcp-listen", listen, env=environment())
    assert result.returncode == 1
    assert f"Error: cannot listen on {listen}: Address already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_kronk_mcp_start_names_a_bad_setting() -> None:
    result = kronk("mcp", "start", "--mcp-brave-timeout", "soon", env=environment())
    assert result.returncode == 1
    assert "Error: mcp.brave_timeout: expected a duration" in result.stderr


def test_help() -> None:
    for command in (["mcp", "--help"], ["mcp", "start", "--help"]):
        result = kronk(*command, env=environment())
        assert result.returncode == 0, result.stderr
        assert "Usage:" in result.stdout
    assert "MCP_MCP_HOST" in result.stdout and "--mcp-braveapikey" in result.stdout
