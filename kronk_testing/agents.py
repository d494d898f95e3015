"""The coding agents' real command-line clients, pinned, installed and pointed at Kronk.

- CLIENTS is the one place their versions are named: the tests, scripts/capture_agent_requests.py
  and the captured requests' file names (tests/data/agents/<name>-<version>.json) read it.
- `install_clients` installs them with npm into the user's cache once (a folder per set of
  versions); later runs reuse it. Without node or npm it raises `ClientsUnavailable`.
- `client_run` configures one client for a Kronk server, exactly as docs/clients.md tells a user
  (`docs_snippets` renders the same configuration with the manual's values), in a throwaway home.
- `RefusingProxy` stands for the network beyond 127.0.0.1: the clients run with it as their
  proxy, so whatever they try to reach elsewhere is refused and recorded.
- `capture_first_request` runs a client against a `RequestRecorder` and returns its first
  request that offers tools, scrubbed of what changes from run to run (ids, paths, dates,
  versions in user agents).
- `scripted_plugin_path` lets a `kronk server start` subprocess load the scripted model
  (kronk_testing.scripted) as an installed plugin.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit


@dataclass(frozen=True)
class AgentClient:
    """A coding agent's command-line client as npm installs it."""

    name: str  # test ids and file names
    package: str
    version: str
    command: str  # what npm links into node_modules/.bin
    # Hosts it tries to reach with the documented configuration all the same (refused here).
    reaches_out: tuple[str, ...] = ()

    @property
    def capture_file(self) -> str:
        """The name of its captured first request under tests/data/agents."""
        return f"{self.name}-{self.version}.json"


CLAUDE_CODE = AgentClient("claude-code", "@anthropic-ai/claude-code", "2.1.332", "claude")
CODEX = AgentClient("codex", "@openai/codex", "0.171.0", "codex")
# OpenCode installs its plugin package (@opencode-ai/plugin) into its configuration folder in
# the background at every start, whatever the configuration says; offline that fails and is
# logged, and the run goes on.
OPENCODE = AgentClient(
    "opencode", "opencode-ai", "1.18.33", "opencode", reaches_out=("registry.npmjs.org",)
)
CLIENTS = (CLAUDE_CODE, CODEX, OPENCODE)


# ---- installing -------------------------------------------------------------------------


class ClientsUnavailable(Exception):
    """The clients cannot be had on this machine (no node or npm, or npm failed)."""


def clients_dir() -> Path:
    """Where the pinned clients are installed: one folder per set of versions."""
    from kronk_core.contract import cache_dir

    pins = "\n".join(f"{client.package}@{client.version}" for client in CLIENTS)
    return cache_dir() / "agents" / hashlib.sha256(pins.encode()).hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` across processes (test sessions installing at once)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def install_clients(folder: Path | None = None) -> Path:
    """The folder of the pinned clients' commands (node_modules/.bin), installed with npm into
    `folder` (default `clients_dir()`) unless a previous run did. Each command is run once
    with --version and must print its pinned version."""
    target = folder or clients_dir()
    commands = target / "node_modules" / ".bin"
    marker = target / "installed.json"
    if marker.is_file():
        return commands
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise ClientsUnavailable(
            "node and npm are needed to install the coding agents' clients "
            f"({', '.join(client.package for client in CLIENTS)}); install Node.js"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.with_name(target.name + ".lock")):
        if marker.is_file():  # another session installed them while this one waited
            return commands
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        pins = {client.package: client.version for client in CLIENTS}
        package = {"private": True, "dependencies": pins}
        (staging / "package.json").write_text(json.dumps(package, indent=2), encoding="utf-8")
        result = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--no-update-notifier"],
            cwd=staging,
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        if result.returncode != 0:
            raise ClientsUnavailable(f"npm install failed:\n{_tail(result.stderr)}")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)  # node_modules/.bin links are relative: they move along
        _check_versions(commands, target / "home")
        marker.write_text(json.dumps(pins), encoding="utf-8")
    return commands


def _check_versions(commands: Path, home: Path) -> None:
    home.mkdir(exist_ok=True)
    for client in CLIENTS:
        result = subprocess.run(
            [str(commands / client.command), "--version"],
            env={"PATH": os.environ.get("PATH", os.defpath), "HOME": str(home)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if client.version not in result.stdout:
            raise RuntimeError(
                f"{client.command} --version printed {result.stdout.strip()!r}, not "
                f"{client.version} (exit status {result.returncode}): {_tail(result.stderr)}"
            )


# ---- the configuration docs/clients.md shows --------------------------------------------


@dataclass(frozen=True)
class Target:
    """What a client is pointed at: a Kronk server and the model it gives the agent."""

    base_url: str  # the server's root, e.g. http://127.0.0.1:8080
    model: str  # a model id (or alias) GET /v1/models lists
    context: int  # that model's context_length
    output: int  # the most tokens one answer may take


@dataclass(frozen=True)
class Variable:
    """An environment variable a client's configuration sets, and why (the manual shows it)."""

    name: str
    value: str
    why: str = ""


def claude_code_variables(target: Target) -> list[Variable]:
    model = target.model
    return [
        Variable("ANTHROPIC_BASE_URL", target.base_url, "the server root, no /v1"),
        Variable("ANTHROPIC_AUTH_TOKEN", "unused", "a Kronk token when auth is on"),
        Variable("ANTHROPIC_MODEL", model, "a model id or alias GET /v1/models lists"),
        Variable("ANTHROPIC_DEFAULT_OPUS_MODEL", model, "the same for the roles it names"),
        Variable("ANTHROPIC_DEFAULT_SONNET_MODEL", model),
        Variable("ANTHROPIC_DEFAULT_HAIKU_MODEL", model, "(its background tasks)"),
        Variable(
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS", str(target.output), "its default 32000 is too much"
        ),
        Variable("API_TIMEOUT_MS", "1800000", "long first prefills on a CPU"),
        Variable("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1", "no telemetry, reports, updates"),
        Variable("DISABLE_AUTOUPDATER", "1"),
    ]


def claude_code_command(task: str) -> list[str]:
    # -p: one task, headless; Write may run without asking (nobody is there to answer).
    return [CLAUDE_CODE.command, "-p", task, "--allowedTools", "Write"]


def codex_config(target: Target) -> str:
    """Codex's config.toml, in the .codex folder of its home."""
    return f"""\
model = "{target.model}"
model_provider = "kronk"
model_context_window = {target.context}   # the model's context_length
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
plugins = false   # its plugin catalog comes from chatgpt.com and GitHub

[model_providers.kronk]
name = "Kronk"
base_url = "{target.base_url}/v1"
wire_api = "responses"
"""


def codex_command(task: str) -> list[str]:
    # exec: one task, headless; its commands may write in the working folder only.
    return [CODEX.command, "exec", "--skip-git-repo-check", "--sandbox", "workspace-write", task]


def opencode_config(target: Target) -> dict[str, Any]:
    """opencode.json in the project (or ~/.config/opencode/opencode.json)."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "kronk": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Kronk",
                "options": {"baseURL": f"{target.base_url}/v1", "apiKey": "unused"},
                "models": {
                    target.model: {
                        "name": target.model,
                        "limit": {"context": target.context, "output": target.output},
                    }
                },
            }
        },
        "model": f"kronk/{target.model}",
        "autoupdate": False,
        "share": "disabled",
    }


def opencode_variables() -> list[Variable]:
    return [Variable("OPENCODE_DISABLE_MODELS_FETCH", "1", "no model catalog from models.dev")]


def opencode_command(task: str) -> list[str]:
    return [OPENCODE.command, "run", task]


# The manual's values: the server's default address and the model of "A model for agents".
DOCS_TARGET = Target("http://127.0.0.1:8080", "qwen3-coder", 65536, 8192)
DOCS_TASK = "Add a test for the date parser."


def _exports(variables: list[Variable]) -> list[str]:
    lines = [f"export {variable.name}={variable.value}" for variable in variables]
    width = max(len(line) for line in lines)
    return [
        f"{line.ljust(width)}   # {variable.why}" if variable.why else line
        for line, variable in zip(lines, variables, strict=True)
    ]


def _block(language: str, lines: list[str]) -> str:
    return "\n".join([f"```{language}", *lines, "```"])


def docs_snippets(target: Target = DOCS_TARGET, task: str = DOCS_TASK) -> dict[str, list[str]]:
    """The fenced blocks docs/clients.md shows for each client (by name): its configuration
    and its headless command line, as `client_run` sets them up."""
    return {
        CLAUDE_CODE.name: [
            _block(
                "shell",
                [*_exports(claude_code_variables(target)), shlex.join(claude_code_command(task))],
            ),
        ],
        CODEX.name: [
            _block("toml", codex_config(target).splitlines()),
            _block("shell", [shlex.join(codex_command(task))]),
        ],
        OPENCODE.name: [
            _block("json", json.dumps(opencode_config(target), indent=2).splitlines()),
            _block("shell", [*_exports(opencode_variables()), shlex.join(opencode_command(task))]),
        ],
    }


# ---- running a client ---------------------------------------------------------------------


@dataclass(frozen=True)
class ClientRun:
    """A client's command line, environment and working folder, configured for a target."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path


def _environment(home: Path, proxy: str) -> dict[str, str]:
    """A fresh environment: nothing of this process's (a developer's API keys, CODEX_HOME,
    XDG folders) reaches the client. Everything beyond 127.0.0.1 goes to `proxy`."""
    environment = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TZ": "UTC",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "SHELL": shutil.which("bash") or "sh",
    }
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        environment[name] = environment[name.lower()] = proxy
    environment["NO_PROXY"] = environment["no_proxy"] = "127.0.0.1,localhost"
    return environment


def client_run(
    client: AgentClient,
    commands: Path,
    target: Target,
    task: str,
    project: Path,
    home: Path,
    proxy: str,
) -> ClientRun:
    """Configure `client` for `target` as docs/clients.md says (its files under `home` or in
    `project`, its variables) and return how to run `task` with it in `project`."""
    project.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    env = _environment(home, proxy)
    if client == CLAUDE_CODE:
        env.update({variable.name: variable.value for variable in claude_code_variables(target)})
        argv = claude_code_command(task)
    elif client == CODEX:
        config = home / ".codex" / "config.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(codex_config(target), encoding="utf-8")
        argv = codex_command(task)
    elif client == OPENCODE:
        config_text = json.dumps(opencode_config(target), indent=2)
        (project / "opencode.json").write_text(config_text, encoding="utf-8")
        env.update({variable.name: variable.value for variable in opencode_variables()})
        argv = opencode_command(task)
    else:
        raise ValueError(f"no configuration for {client.name}")
    return ClientRun([str(commands / argv[0]), *argv[1:]], env, project)


@dataclass(frozen=True)
class ClientResult:
    returncode: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        """What a failed assertion shows."""
        return (
            f"exit status {self.returncode}\n--- stdout\n{_tail(self.stdout, 40)}\n"
            f"--- stderr\n{_tail(self.stderr, 40)}"
        )


def run_client(run: ClientRun, timeout: float) -> ClientResult:
    """Run a client to its end (its own process group, killed with whatever it left running,
    such as OpenCode's background install, or everything after `timeout` seconds)."""
    out, err = run.cwd / ".client-stdout", run.cwd / ".client-stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            run.argv,
            cwd=run.cwd,
            env=run.env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            returncode = -signal.SIGKILL
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    result = ClientResult(
        returncode,
        out.read_text(encoding="utf-8", errors="replace"),
        err.read_text(encoding="utf-8", errors="replace"),
    )
    out.unlink()
    err.unlink()
    return result


# ---- local servers: the network outside, a recorder ------------------------------------


class _LocalServer:
    """An HTTP server on a free port of 127.0.0.1, in a thread, while in `with`."""

    def __init__(self) -> None:
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Self:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class RefusingProxy(_LocalServer):
    """A proxy that refuses every request (403) and records the host each was for."""

    def __init__(self) -> None:
        super().__init__()
        self.hosts: list[str] = []

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hosts = self.hosts

        class Refuse(BaseHTTPRequestHandler):
            def _refuse(self) -> None:
                # CONNECT names host:port; a plain request through a proxy names its whole URL.
                where = self.path if self.command == "CONNECT" else urlsplit(self.path).netloc
                hosts.append(where.rpartition(":")[0] if ":" in where else where)
                self.send_response(403)
                self.send_header("Content-Length", "0")
                self.send_header("Connection", "close")
                self.end_headers()

            do_CONNECT = do_GET = do_POST = do_PUT = do_HEAD = _refuse

            def log_message(self, *_: object) -> None:
                pass

        return Refuse


class RequestRecorder(_LocalServer):
    """Records every request ({method, path, headers, body}) and answers each with a 400,
    which every client reports and stops at."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[dict[str, Any]] = []

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        requests = self.requests

        class Record(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _record(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body: Any = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                headers = dict(self.headers.items())
                requests.append(
                    {"method": self.command, "path": self.path, "headers": headers, "body": body}
                )
                error = {"type": "invalid_request_error", "message": "recorded, not served"}
                answer = json.dumps({"type": "error", "error": error}).encode()
                self.send_response(400)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST = _record

            def log_message(self, *_: object) -> None:
                pass

        return Record


# ---- captured requests --------------------------------------------------------------------

CAPTURE_TASK = "Say hello."
# Claude Code is captured under one of its own model names (which a Kronk alias serves): under
# a name it does not know, such as the manual's model id, it sends a shorter system prompt.
CAPTURE_MODELS = {CLAUDE_CODE.name: "claude-sonnet-4-6"}
CAPTURE_MODEL = "agent-model"
# Connection details, not the request's: a port and a length.
DROPPED_HEADERS = {"host", "content-length"}
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# Device ids and other hashes of this machine or session.
_HEX = re.compile(r"\b[0-9a-f]{32,}\b")
# OpenCode's ids: a prefix and 26 characters (ses_dd9dd3da3ffe08SQ5iNtUZmPEg).
_OPENCODE_ID = re.compile(r"\b(ses|msg|prt|per|que|tool)_[0-9A-Za-z]{20,}\b")
_VERSION = re.compile(r"\d+\.\d+\.\d+")
# Times in seconds or milliseconds since the epoch (Codex's turn_started_at_unix_ms).
_EPOCH = re.compile(r"\b\d{10}(\d{3})?\b")


def _scrubber(replacements: dict[str, str]) -> Callable[[str], str]:
    """A function that scrubs a string: `replacements` (longest first), then ids and dates."""
    now = datetime.datetime.now(datetime.UTC)
    dates = {now.date().isoformat(), now.strftime("%a %b %d %Y"), now.strftime("%Y/%m/%d")}
    pairs = sorted(
        [*replacements.items(), *((date, "<date>") for date in dates)],
        key=lambda pair: -len(pair[0]),
    )
    pairs.append((platform.release(), "<os-release>"))
    seconds = now.timestamp()
    uuids: dict[str, str] = {}

    def uuid(match: re.Match[str]) -> str:
        # Numbered in order of appearance: an id sent twice stays one id.
        return uuids.setdefault(match.group(), f"00000000-0000-4000-8000-{len(uuids) + 1:012d}")

    def epoch(match: re.Match[str]) -> str:
        value = int(match.group()) / (1000 if match.group(1) else 1)
        return "0" if abs(value - seconds) < 86400 else match.group()

    def scrub(text: str) -> str:
        for old, new in pairs:
            text = text.replace(old, new)
        text = _UUID.sub(uuid, text)
        text = _HEX.sub(lambda match: "0" * len(match.group()), text)
        text = _EPOCH.sub(epoch, text)
        return _OPENCODE_ID.sub(lambda match: f"{match.group(1)}_<id>", text)

    return scrub


def scrub_request(request: dict[str, Any], replacements: dict[str, str]) -> dict[str, Any]:
    """`request` ({method, path, headers, body}) without what changes between two runs of the
    same client: the folders it ran in and the server's address (`replacements`, old → new,
    in every string), today's date, the machine's kernel release, ids (UUIDs, long hex
    strings, OpenCode's), times, versions in the user agent, and the Host and Content-Length
    headers. Keys and headers are sorted by name: Codex sends some in random order."""
    scrub = _scrubber(replacements)

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return scrub(value)
        if isinstance(value, list):
            return [walk(item) for item in value]
        if isinstance(value, dict):
            return {scrub(key): walk(value[key]) for key in sorted(value)}
        return value

    headers = {}
    for name, value in sorted(request["headers"].items()):
        if name.lower() in DROPPED_HEADERS:
            continue
        if name.lower() == "user-agent":
            value = _VERSION.sub("<version>", value)
        headers[name] = walk(value)
    return {
        "method": request["method"],
        "path": walk(request["path"]),
        "headers": headers,
        "body": walk(request["body"]),
    }


def capture_first_request(client: AgentClient, commands: Path, work: Path) -> dict[str, Any]:
    """`client`'s first request that offers tools (its agent's turn), as it sends it to a
    server configured as docs/clients.md says, scrubbed (`scrub_request`). It runs in
    `work`/project with `work`/home, against a recorder that answers 400."""
    project, home = work / "project", work / "home"
    with RequestRecorder() as recorder, RefusingProxy() as proxy:
        model = CAPTURE_MODELS.get(client.name, CAPTURE_MODEL)
        target = Target(recorder.url, model, 32768, 4096)
        run = client_run(client, commands, target, CAPTURE_TASK, project, home, proxy.url)
        result = run_client(run, timeout=180)
    for request in recorder.requests:
        body = request["body"]
        if isinstance(body, dict) and body.get("tools"):
            address = urlsplit(recorder.url).netloc
            replacements = {
                str(project): "<project>",
                # Claude Code names a project's folder by its path, with dashes for the rest.
                re.sub(r"[^A-Za-z0-9]", "-", str(project)): "<project-key>",
                str(home): "<home>",
                address: "127.0.0.1:8080",
            }
            return scrub_request(request, replacements)
    raise RuntimeError(f"{client.name} sent no request with tools; {result.describe()}")


def _tool_name(tool: dict[str, Any]) -> str | None:
    function = tool.get("function")
    name = function.get("name") if isinstance(function, dict) else tool.get("name")
    return name if isinstance(name, str) else None


def request_shape(request: dict[str, Any]) -> dict[str, Any]:
    """What a captured request is made of, without its text: method, path, header names (not
    DROPPED_HEADERS), body keys, tools (type and name) and the roles or types of its messages
    (input items)."""
    body = request["body"]
    items = body.get("messages") or body.get("input") or []
    return {
        "method": request["method"],
        "path": request["path"],
        "headers": sorted(
            name.lower() for name in request["headers"] if name.lower() not in DROPPED_HEADERS
        ),
        "body": sorted(body),
        "tools": [[tool.get("type"), _tool_name(tool)] for tool in body.get("tools", [])],
        "items": [item.get("role") or item.get("type") for item in items],
    }


# ---- a server subprocess with the scripted model -------------------------------------------


def scripted_plugin_path(folder: Path) -> Path:
    """`folder`, made to hold the metadata of an installed distribution whose entry point
    (group `kronk`) is kronk_testing.scripted: with `folder` on PYTHONPATH, a `kronk server
    start` subprocess registers the scripted backend as any installed plugin."""
    from kronk_core.contract import ENTRY_POINT_GROUP
    from kronk_testing import scripted

    info = folder / "kronk_testing_scripted-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    metadata = "Metadata-Version: 2.1\nName: kronk-testing-scripted\nVersion: 0\n"
    (info / "METADATA").write_text(metadata, encoding="utf-8")
    entry_point = f"[{ENTRY_POINT_GROUP}]\n{scripted.BACKEND} = {scripted.__name__}\n"
    (info / "entry_points.txt").write_text(entry_point, encoding="utf-8")
    return folder
