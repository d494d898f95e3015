"""Today's coding agents, end to end: the real Claude Code, Codex and OpenCode command-line
clients (the versions kronk_testing/agents.py pins, installed with npm into the user's cache
on first use) run headless against a real `kronk server start`, each configured exactly as
docs/clients.md says, in a throwaway home, with no network beyond 127.0.0.1 (their proxy is
one that refuses everything and records where they tried to go).

- One turn on Gemma 3 270M, the packaged model, served at its GGUF's 32768-token context:
  the client's real first request (its system prompt and tools, thousands of tokens) is
  prefilled and answered, and the client exits 0. The answers are kept short (64 tokens, the
  client's own output limit or, for Codex, which sends none, the model entry's
  `sampling.max_tokens`) and end at their first line break (the entry's `stop`: a base
  model never generates its end-of-turn token, and Claude Code and Codex take an answer
  cut at their limit for an error).
- A tool round trip: the client gets a tool call through Kronk, runs it (Claude Code's Write,
  Codex's exec_command, OpenCode's write), sends the result back and ends with a final answer;
  the test reads the file on disk. A tiny real model cannot be trusted to choose that call, and
  a grammar cannot force it (the clients send `tool_choice: auto`), so the model is the
  harness's scripted one (kronk_testing.scripted), which the server process loads as an
  installed plugin. Its reply to the task is the call in Hermes text (`<tool_call>{...}
  </tool_call>`); the real ChatML template renders the clients' tools and history, the
  templates plugin's hermes parser turns the reply into a tool call and each dialect sends it in
  its own shape, exactly as for a model that writes Hermes calls. Once the tool's result is in
  the prompt (`</tool_response>`), its reply is the final answer.
- The captured first requests (tests/data/agents, refreshed by
  scripts/capture_agent_requests.py) have the shape the pinned versions send today.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from kronk_llamacpp.packaged import GEMMA_MODEL_ID
from kronk_testing import scripted
from kronk_testing.agents import (
    CLAUDE_CODE,
    CLIENTS,
    CODEX,
    OPENCODE,
    AgentClient,
    ClientResult,
    ClientsUnavailable,
    RefusingProxy,
    Target,
    capture_first_request,
    client_run,
    docs_snippets,
    install_clients,
    request_shape,
    run_client,
    scripted_plugin_path,
)
from kronk_testing.server import free_port
from kronk_testing.waiting import reached

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "clients.md"
CAPTURES = ROOT / "tests" / "data" / "agents"

GEMMA_CONTEXT = 32768  # its GGUF's training length
# Gemma 3 270M is a base model: it never generates its end-of-turn token, so its entry in
# the server's model-config file ends its answers at the first line break (docs/clients.md).
GEMMA_TURN_END = ["\n"]
ANSWER_TOKENS = 64
SCRIPTED_MODEL = "scripted-agent"
# Bytes are the scripted model's tokens: room for a client's whole prompt.
SCRIPTED_CONTEXT = 262144
GREETING_FILE = "greeting.txt"
GREETING = "Hello from Kronk"
FINAL_ANSWER = "The greeting is written."
# The task each client gets for the round trip: the scripted model's trigger for its call.
TOOL_TASKS = {client.name: f"Write {GREETING_FILE} for {client.name}." for client in CLIENTS}


def tool_call(name: str, arguments: dict[str, str]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def round_trip_calls(projects: dict[str, Path]) -> dict[str, str]:
    """Each client's call that writes GREETING into GREETING_FILE in its project, with its own
    tool."""

    def target(client: AgentClient) -> str:
        return str(projects[client.name] / GREETING_FILE)

    return {
        CLAUDE_CODE.name: tool_call(
            "Write", {"file_path": target(CLAUDE_CODE), "content": GREETING}
        ),
        CODEX.name: tool_call("exec_command", {"cmd": f"echo '{GREETING}' > {GREETING_FILE}"}),
        OPENCODE.name: tool_call("write", {"filePath": target(OPENCODE), "content": GREETING}),
    }


@dataclass(frozen=True)
class Served:
    """The server the clients talk to, the models they are given, and the folders (project
    and home) of each client's round trip."""

    gemma: Target
    scripted: Target
    round_trips: dict[str, Path]


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture(scope="session")
def commands() -> Path:
    """The pinned clients' commands (installed once per set of versions)."""
    try:
        return install_clients()
    except ClientsUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`kronk server start` in a child process, as a user runs it, with two models: the
    packaged Gemma (loaded before the server answers) and the scripted model."""
    root = tmp_path_factory.mktemp("agent-clients")
    round_trips = {client.name: root / "round-trip" / client.name for client in CLIENTS}
    calls = round_trip_calls({name: folder / "project" for name, folder in round_trips.items()})
    replies = [(TOOL_TASKS[name], call) for name, call in calls.items()]
    script = scripted.Script(
        replies=(*replies, ("</tool_response>", FINAL_ANSWER)), context_length=SCRIPTED_CONTEXT
    )
    models = {
        # No context_window: the packaged model gets its training length.
        GEMMA_MODEL_ID: {
            "n_seq_max": 2,
            "sampling": {"max_tokens": ANSWER_TOKENS},
            "stop": GEMMA_TURN_END,
        },
        SCRIPTED_MODEL: {
            "backend": scripted.BACKEND,
            "model_path": str(scripted.write_script(root / "script.json", script)),
            "context_window": SCRIPTED_CONTEXT,
            "n_seq_max": 2,
            "templates": {"template": "chatml", "tool_format": "hermes"},
        },
    }
    models_file = root / "models.yaml"
    models_file.write_text(yaml.safe_dump({"models": models}), encoding="utf-8")

    port = free_port()
    environment = {key: value for key, value in os.environ.items() if not key.startswith("KRONK_")}
    plugins = str(scripted_plugin_path(root / "plugins"))
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [plugins, os.environ.get("PYTHONPATH")])
    )
    environment.update(
        # The plugins' own listeners, on ports of their own rather than their fixed defaults.
        KRONK_MCP_HOST=f"127.0.0.1:{free_port()}",
        KRONK_DEBUG_HOST=f"127.0.0.1:{free_port()}",
        KRONK_LOG_FORMAT="text",
    )
    command = [sys.executable, "-m", "kronk_api.cli", "server", "start"]
    command += ["--api-host", f"127.0.0.1:{port}", "--base-path", str(root / "base")]
    command += ["--model-config-file", str(models_file), "--model", GEMMA_MODEL_ID, "--preload"]
    log = root / "server.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=environment)
    base_url = f"http://127.0.0.1:{port}"
    try:
        ready = reached(
            lambda: process.poll() is not None or _answers(f"{base_url}/v1/readiness"), 600
        )
        assert ready and process.poll() is None, log.read_text(errors="replace")[-4000:]
        contexts = {
            entry["id"]: entry["context_length"]
            for entry in httpx.get(f"{base_url}/v1/models", timeout=30).json()["data"]
        }
        assert contexts[GEMMA_MODEL_ID] == GEMMA_CONTEXT, contexts
        yield Served(
            gemma=Target(base_url, GEMMA_MODEL_ID, GEMMA_CONTEXT, ANSWER_TOKENS),
            scripted=Target(base_url, SCRIPTED_MODEL, SCRIPTED_CONTEXT, 1024),
            round_trips=round_trips,
        )
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_agent(
    client: AgentClient, commands: Path, target: Target, task: str, folder: Path, timeout: float
) -> ClientResult:
    """`task` with `client` in `folder`/project (its home `folder`/home); it may reach nothing
    beyond 127.0.0.1 but what it is known to try whatever its configuration (`reaches_out`)."""
    with RefusingProxy() as proxy:
        run = client_run(
            client, commands, target, task, folder / "project", folder / "home", proxy.url
        )
        result = run_client(run, timeout)
    outside = sorted(set(proxy.hosts) - set(client.reaches_out))
    assert not outside, f"{client.name} tried to reach {outside}\n{result.describe()}"
    return result


CLIENT_IDS = [client.name for client in CLIENTS]


@pytest.mark.parametrize("client", CLIENTS, ids=CLIENT_IDS)
def test_a_tool_round_trip(client: AgentClient, commands: Path, served: Served) -> None:
    folder = served.round_trips[client.name]
    result = run_agent(client, commands, served.scripted, TOOL_TASKS[client.name], folder, 300)
    assert result.returncode == 0, result.describe()
    written = folder / "project" / GREETING_FILE
    assert written.is_file(), f"{client.name} did not write {written}\n{result.describe()}"
    assert written.read_text(encoding="utf-8").strip() == GREETING
    assert FINAL_ANSWER in result.stdout, result.describe()


@pytest.mark.parametrize("client", CLIENTS, ids=CLIENT_IDS)
def test_one_turn_on_gemma(
    client: AgentClient, commands: Path, served: Served, tmp_path: Path
) -> None:
    result = run_agent(client, commands, served.gemma, "Say hello.", tmp_path, 1200)
    assert result.returncode == 0, result.describe()
    assert result.stdout.strip(), result.describe()


def test_the_manual_shows_the_configuration_tested_here() -> None:
    """docs/clients.md holds each client's configuration and command line as the tests set
    them up (kronk_testing.agents renders them with the manual's server and model)."""
    text = DOCS.read_text(encoding="utf-8")
    for client, blocks in docs_snippets().items():
        for block in blocks:
            assert block in text, f"{DOCS.name} lacks this block for {client}:\n{block}"
    # The packaged Gemma's entry, as the server here serves it.
    entry = f"  {GEMMA_MODEL_ID}:\n    stop: {json.dumps(GEMMA_TURN_END)}"
    assert entry in text and f"max_tokens: {ANSWER_TOKENS}" in text, entry


@pytest.mark.parametrize("client", CLIENTS, ids=CLIENT_IDS)
def test_the_captured_request_is_the_pinned_version_s(
    client: AgentClient, commands: Path, tmp_path: Path
) -> None:
    """What the client sends first today has the captured request's shape (the dialect tests
    send the captured one): after a version bump, scripts/capture_agent_requests.py writes the
    new version's."""
    stored = CAPTURES / client.capture_file
    assert stored.is_file(), f"no {stored.name}: run scripts/capture_agent_requests.py"
    captured = json.loads(stored.read_text(encoding="utf-8"))
    fresh = capture_first_request(client, commands, tmp_path)
    assert request_shape(fresh) == request_shape(captured)
