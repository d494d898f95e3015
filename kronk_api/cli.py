"""The `kronk` command line. Every setting's flag and KRONK_* variable follow one rule."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import click
from pydantic import ValidationError

from kronk_api.bool_flags import BoolValueGroup
from kronk_api.client import call_server
from kronk_api.drain import Drain
from kronk_api.listen import ListenError, listen
from kronk_api.logs import configure_logging
from kronk_api.options import (
    ServerStartCommand,
    cli_plugins,
    config_file_option,
    setting_option,
)
from kronk_api.plugin_list import describe_plugins
from kronk_api.settings import (
    ServerSettings,
    Setting,
    bind_sections,
    environment_for,
    load_settings,
    server_sections,
)
from kronk_api.terminal_chat import TerminalChat, interactive
from kronk_api.timeouts import HttpTimeouts
from kronk_core import Kronk, KronkConfig
from kronk_core.contract.errors import KronkError
from kronk_core.runtime.loading import model_config_for
from kronk_core.settings.config import (
    ModelConfig,
    default_base_path,
    load_model_config_file,
    names_a_file,
)
from kronk_core.settings.model_files import delete_model_files, removable_files
from kronk_core.settings.sections import config_error_from

log = logging.getLogger(__name__)

api_host_option = setting_option("api_host", help="HOST:PORT of the server [127.0.0.1:8080]")
base_path_option = setting_option(
    "base_path", type=click.Path(path_type=Path), help="Base directory for Kronk data [~/.kronk]"
)
model_config_option = setting_option(
    "model_config_file", type=click.Path(path_type=Path), help="YAML file with per-model settings"
)


def _base_path(value: Path | None) -> Path:
    return (value or default_base_path()).expanduser()


def _pid_file(base: Path) -> Path:
    return base / "server.pid"


def _log_file(base: Path) -> Path:
    return base / "logs" / "server.log"


def _fail(error: KronkError) -> NoReturn:
    raise click.ClickException(error.message)


def _local_config(
    base_path: Path | None, model_config_file: Path | None, model: str | None = None
) -> KronkConfig:
    """SDK config for commands that work without a server (model list, show, run); `model`
    a model file's path makes that file a model (`kronk run ./x.gguf`)."""
    models = load_model_config_file(model_config_file) if model_config_file else {}
    try:
        return KronkConfig(
            base_path=_base_path(base_path),
            models=models,
            default_model=model if model and names_a_file(model) else None,
        )
    except ValidationError as exc:
        raise config_error_from(exc) from None


# `kronk server start` flags that choose llama.cpp's libraries: the llamacpp plugin binds
# libllama when it is imported, so their variables are set before the plugins load.
EARLY_VARIABLES = {"--processor": "KRONK_PROCESSOR", "--lib-path": "KRONK_LIB_PATH"}


def _set_early_variables(args: Sequence[str]) -> None:
    if list(args[:2]) != ["server", "start"]:
        return
    rest = list(args[2:])
    for position, arg in enumerate(rest):
        name, equals, value = arg.partition("=")
        if name in EARLY_VARIABLES and (equals or position + 1 < len(rest)):
            os.environ[EARLY_VARIABLES[name]] = value if equals else rest[position + 1]


class KronkGroup(BoolValueGroup):
    """Lets plugins add sub-commands through the kronk_cli hook; its sub-groups are
    BoolValueGroups (boolean flags take `=VALUE` everywhere)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plugins_added = False

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        _set_early_variables(args)
        return super().parse_args(ctx, args)

    def _add_plugin_commands(self) -> None:
        if not self._plugins_added:
            self._plugins_added = True
            cli_plugins().hook.kronk_cli(group=self)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._add_plugin_commands()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self._add_plugin_commands()
        return super().get_command(ctx, cmd_name)


@click.group(cls=KronkGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kronk")
def main() -> None:
    """Kronk: a local inference server and SDK for GGUF models."""


@main.group()
def server() -> None:
    """Start, stop and inspect the model server."""


@server.command("start", cls=ServerStartCommand)
@config_file_option
@click.option(
    "-d",
    "--detach",
    is_flag=True,
    envvar="KRONK_DETACH",
    help="Run in the background once ready; logs go to the log file",
)
@click.option(
    "--ready-timeout",
    type=float,
    default=600.0,
    show_default=True,
    envvar="KRONK_READY_TIMEOUT",
    help="With -d: seconds to wait for the server to be ready",
)
@click.pass_context
def server_start(
    ctx: click.Context,
    /,
    config_file: Path | None,
    detach: bool,
    ready_timeout: float,
    **_: Any,
) -> None:
    """Start the model server.

    Every setting has a flag and a KRONK_* variable named after it (see
    --help); plugins add theirs for their own settings sections.
    """
    command = ctx.command
    assert isinstance(command, ServerStartCommand)
    try:
        sections = server_sections(cli_plugins())
        settings = bind_sections(
            load_settings(config_file, command.overrides(ctx.params), sections), cli_plugins()
        )
    except KronkError as exc:
        _fail(exc)
    if detach:
        _start_detached(settings, command.schema, ready_timeout)
        return
    _serve(settings)


def _serve(settings: ServerSettings) -> None:
    configure_logging(settings.log_level, settings.log_format)
    # The address first: a taken port is one line and exit status 1, before any model loads.
    try:
        sock = listen(settings.host.strip("[]"), settings.port)
    except ListenError as exc:
        hint = " (another server runs there: `kronk server stop`, or --api-host)"
        raise click.ClickException(exc.message + (hint if exc.in_use else "")) from None
    host, port = sock.getsockname()[:2]
    log.info("listening on http://%s:%d", f"[{host}]" if ":" in host else host, port)
    base = settings.base_path.expanduser()
    base.mkdir(parents=True, exist_ok=True)
    _pid_file(base).write_text(str(os.getpid()))
    try:
        _run(settings, sock)
    finally:
        _pid_file(base).unlink(missing_ok=True)


def _run(settings: ServerSettings, sock: socket.socket) -> None:
    import uvicorn

    from kronk_api.app import create_app
    from kronk_api.connections import ConnectionGuard

    try:
        app = create_app(settings)
        if settings.preload:
            # Here rather than in the app's start-up, whose failure is a traceback: a model
            # that cannot load is one line too (start-up then finds it loaded).
            app.state.kronk.load(settings.model, keep=True)
    except KronkError as exc:
        sock.close()
        _fail(exc)
    guard = ConnectionGuard(
        read_header_timeout=settings.read_header_timeout,
        max_connections_per_client=settings.max_connections_per_client,
        max_header_bytes=settings.max_header_bytes,
    )
    # log_config=None: uvicorn's loggers propagate to Kronk's handler.
    config = uvicorn.Config(
        HttpTimeouts(app, settings.read_timeout, settings.write_timeout),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,
        timeout_keep_alive=settings.idle_timeout,  # type: ignore[arg-type]  # float works
        # Running requests get this long to finish; then uvicorn cancels them, and their
        # streams' cancellation frees their slots.
        timeout_graceful_shutdown=settings.shutdown_timeout,  # type: ignore[arg-type]
        # The header deadline and the connection limits: uvicorn's h11 protocol, guarded.
        **guard.uvicorn_options(),
    )
    # After a graceful stop uvicorn raises the signal again; Ctrl-C then ends quietly.
    with contextlib.suppress(KeyboardInterrupt):
        _draining_server(uvicorn, config, app.state.drain, settings.shutdown_timeout).run(
            sockets=[sock]
        )


def _draining_server(uvicorn: Any, config: Any, drain: Drain, timeout: float) -> Any:
    """A uvicorn server whose first SIGTERM/SIGINT drains before it stops: readiness goes
    503 (the balancer stops sending new work) while the listener stays open and running
    requests finish, for up to `timeout` seconds; a second signal stops it at once."""

    class DrainingServer(uvicorn.Server):  # type: ignore[misc]
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if drain.draining or self.should_exit:
                super().handle_exit(sig, frame)
                return
            drain.start()
            log.info("draining: readiness answers 503; waiting for running requests")

            def stop_when_idle() -> None:
                began = time.monotonic()
                if not drain.wait_idle(timeout):
                    log.warning("drain: requests still running after %gs; stopping", timeout)
                # One shutdown timeout in all: uvicorn's graceful wait gets what is left
                # (never 0, which uvicorn reads as no limit).
                left = timeout - (time.monotonic() - began)
                self.config.timeout_graceful_shutdown = max(left, 0.1)
                super(DrainingServer, self).handle_exit(sig, frame)

            threading.Thread(target=stop_when_idle, name="kronk-drain", daemon=True).start()

    return DrainingServer(config)


def _start_detached(settings: ServerSettings, schema: list[Setting], ready_timeout: float) -> None:
    """Start a foreground server in the background; return once it answers, or say why not."""
    base = settings.base_path.expanduser()
    log_file = _log_file(base)
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


@server.command("stop")
@base_path_option
@click.option(
    "--timeout",
    default=30.0,
    show_default=True,
    envvar="KRONK_STOP_TIMEOUT",
    help="Seconds to wait for exit",
)
def server_stop(base_path: Path | None, timeout: float) -> None:
    """Stop a server started from this base path."""
    pid_file = _pid_file(_base_path(base_path))
    if not pid_file.exists():
        raise click.ClickException("no running server found (no pid file)")
    pid = int(pid_file.read_text())
    if not _is_kronk_process(pid):
        pid_file.unlink(missing_ok=True)
        raise click.ClickException(f"server process {pid} is not running")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _is_kronk_process(pid):
            # uvicorn re-raises SIGTERM after its shutdown, so the server can't clean up.
            pid_file.unlink(missing_ok=True)
            click.echo(f"stopped server (pid {pid})")
            return
        time.sleep(0.1)
    raise click.ClickException(f"server (pid {pid}) did not exit within {timeout}s")


def _is_kronk_process(pid: int) -> bool:
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


@server.command("logs")
@base_path_option
@click.option(
    "-n",
    "--lines",
    default=100,
    show_default=True,
    envvar="KRONK_LOG_LINES",
    help="How many lines to show",
)
def server_logs(base_path: Path | None, lines: int) -> None:
    """Show the log of a server started with -d."""
    log_file = _log_file(_base_path(base_path))
    if not log_file.exists():
        raise click.ClickException(f"no log file at {log_file}")
    for line in log_file.read_text(errors="replace").splitlines()[-lines:]:
        click.echo(line)


@main.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text")
def plugins(as_json: bool) -> None:
    """List installed plugins: what each provides and whether configuration disabled it."""
    with Kronk(KronkConfig()) as kronk:
        reports = describe_plugins(kronk)
    if as_json:
        click.echo(json.dumps([asdict(report) for report in reports], indent=2))
        return
    for report in reports:
        where = f" ({report.distribution})" if report.distribution else ""
        if not report.active:
            click.echo(f"{report.name}{where}: disabled by configuration")
            continue
        click.echo(f"{report.name}{where}")
        click.echo(f"  hooks: {', '.join(report.hooks) or 'none'}")
        for kind, names in report.registered.items():
            click.echo(f"  {kind}: {', '.join(names)}")
        for level, names in report.settings.items():
            click.echo(f"  {level} settings: {', '.join(names)}")


@main.group()
def model() -> None:
    """Models: list, show and remove them; what a server has loaded (plugins add: pull)."""


@model.command("list")
@base_path_option
@model_config_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table")
def model_list(base_path: Path | None, model_config_file: Path | None, as_json: bool) -> None:
    """List the models Kronk can serve: size, quantization, trained context length, the
    window a request gets per slot, and file."""
    try:
        config = _local_config(base_path, model_config_file)
        with Kronk(config) as kronk:
            found = [_describe(kronk, model_id) for model_id in kronk.model_ids()]
    except KronkError as exc:
        _fail(exc)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    rows = [("ID", "SIZE", "QUANTIZATION", "CONTEXT", "WINDOW", "FILE")]
    for entry in found:
        rows.append(
            (
                entry["id"],
                "-" if entry["size_bytes"] is None else _size(entry["size_bytes"]),
                entry["quantization"] or "-",
                str(entry["context_length"] or "-"),
                str(entry["context_window"] or "-"),
                entry["model_path"] or "-",
            )
        )
    _table(rows)
    # A broken model is listed, and why it cannot be served is said under the table.
    for entry in found:
        if "error" in entry:
            click.echo(f"{entry['id']}: {entry['error']}")


def _describe(kronk: Kronk, model_id: str) -> dict[str, Any]:
    """A model's file and what the file says: `kronk model list`'s entry. A model that
    cannot be resolved is listed with the reason (`error`) instead."""
    entry: dict[str, Any] = {"id": model_id, "model_path": None, "size_bytes": None}
    keys = ("architecture", "parameters", "quantization", "context_length", "context_window")
    entry.update(dict.fromkeys(keys))
    try:
        path = model_config_for(kronk, model_id).model_path
        assert path is not None  # resolved
        entry["model_path"] = str(path)
        entry["size_bytes"] = sum(part.stat().st_size for part in kronk.model_parts(path))
        facts = kronk.model_facts(model_id)
    except (KronkError, OSError) as exc:
        return {**entry, "error": exc.message if isinstance(exc, KronkError) else str(exc)}
    if facts is not None:
        entry.update(asdict(facts))
    # What a request gets per slot, as a load would choose it now (the trained length,
    # lowered to what fits, or the entry's context_window), beside what the file says.
    entry["context_window"] = kronk.context_length(model_id)
    return entry


@model.command("show")
@click.argument("model_id", required=False)
@base_path_option
@model_config_option
def model_show(
    model_id: str | None, base_path: Path | None, model_config_file: Path | None
) -> None:
    """Show a model's file, what the file says (architecture, parameters, quantization,
    context length), its settings, and what loading it would take (memory estimate)."""
    try:
        kronk = Kronk(_local_config(base_path, model_config_file, model_id))
        model_id = kronk.resolve(model_id, pull=False)
        config = model_config_for(kronk, model_id)
        facts = kronk.model_facts(model_id)
        estimate = kronk.memory_estimate(model_id)
    except KronkError as exc:
        _fail(exc)
    assert config.model_path is not None  # resolved
    size = sum(part.stat().st_size for part in kronk.model_parts(config.model_path))
    click.echo(f"model:           {model_id}")
    click.echo(f"file:            {config.model_path}")
    click.echo(f"size:            {_size(size)}")
    if facts is not None:
        click.echo(f"architecture:    {facts.architecture}")
        click.echo(f"parameters:      {_count(facts.parameters)} ({facts.parameters:,})")
        click.echo(f"quantization:    {facts.quantization}")
        click.echo(f"context length:  {facts.context_length} (trained)")
    if config.projector_path is not None:
        reads = (
            " and ".join("images" if kind == "image" else "sounds" for kind in estimate.media)
            if estimate is not None
            else "see its backend"
        )
        click.echo(f"projector:       {config.projector_path} (reads {reads or 'nothing'})")
    settings = _settings_set(config)
    width = max([16, *(len(key) + 1 for key in settings)])
    for key, value in settings.items():
        click.echo(f"{key + ':':<{width}} {value}")
    if estimate is None:
        click.echo("memory estimate: not available from its backend")
        return
    projector = (
        f" + projector {_size(estimate.projector_bytes)}" if estimate.projector_bytes else ""
    )
    click.echo(
        f"memory estimate: {_size(estimate.total_bytes)} = weights {_size(estimate.weights_bytes)}"
        f"{projector} + KV cache {_size(estimate.kv_bytes)}"
    )
    click.echo(
        f"  KV cache:      context_window {estimate.context_window} x n_seq_max "
        f"{estimate.n_seq_max} x {estimate.kv_bytes_per_token} bytes per token "
        f"({estimate.n_layer} layers, cache_type_k {estimate.cache_type_k}, "
        f"cache_type_v {estimate.cache_type_v})"
    )
    for share in estimate.placement:
        verdict = "fits" if share.fits else "DOES NOT FIT"
        click.echo(
            f"  on {share.device}: {_size(share.total_bytes)} of {_size(share.memory_free)} free"
            f" ({verdict})"
        )


@model.command("rm")
@click.argument("model_id")
@base_path_option
@model_config_option
@api_host_option
@click.option(
    "--token", envvar="KRONK_TOKEN", help="Admin token, for a server with authentication on"
)
@click.option("--force", is_flag=True, help="Unload it from the running server first")
def model_rm(
    model_id: str,
    base_path: Path | None,
    model_config_file: Path | None,
    api_host: str | None,
    token: str | None,
    force: bool,
) -> None:
    """Delete a model installed or pulled under <base>/models (every part, and a projector
    left alone beside it). Refused while the server at --api-host has it loaded, unless
    --force unloads it there first."""
    try:
        config = _local_config(base_path, model_config_file)
        with Kronk(config) as kronk:
            sources = kronk.model_sources()
            removed = removable_files(config, model_id, kronk.provided_models(), sources)
    except KronkError as exc:
        _fail(exc)
    files = removed.parts
    host = api_host or "127.0.0.1:8080"
    pool = call_server(host, "GET", "/v1/kronk/models", token=token, absent_ok=True)
    ours = {path.resolve() for path in files}
    loaded = [
        entry["id"]
        for entry in (pool or {"data": []})["data"]
        if Path(entry["model_path"]).resolve() in ours
    ]
    if loaded and not force:
        raise click.ClickException(
            f"{model_id} is loaded on the server at {host} (as {', '.join(loaded)}): "
            "unload it first (`kronk model unload ID`), or pass --force"
        )
    for loaded_id in loaded:
        route = f"/v1/kronk/models/{urllib.parse.quote(loaded_id, safe='')}/unload"
        call_server(host, "POST", route, token=token)
        click.echo(f"unloaded {loaded_id} from the server at {host}")
    size = sum(path.stat().st_size for path in files)
    delete_model_files(config, removed, sources)
    for path in files:
        click.echo(f"deleted {path}")
    click.echo(f"removed {model_id} ({_size(size)})")


model.add_command(model_rm, "remove")


def _settings_set(config: ModelConfig) -> dict[str, Any]:
    """The keys a model's entry sets away from their defaults, plugin sections' as `name.key`."""
    found = config.model_dump(
        mode="json",
        exclude_defaults=True,
        exclude={"id", "model_path", "projector_path", "sections"},
    )
    for name, section in config.sections.items():
        dumped = section.model_dump(mode="json", exclude_defaults=True)
        found.update({f"{name}.{key}": value for key, value in dumped.items()})
    return found


@main.command("devices")
def devices() -> None:
    """List the devices models can run on, with free and total memory."""
    try:
        found = Kronk(KronkConfig()).devices()
    except KronkError as exc:
        _fail(exc)
    rows = [("INDEX", "NAME", "TYPE", "FREE", "TOTAL", "DESCRIPTION")]
    for device in found:
        rows.append(
            (
                str(device.index),
                device.name,
                device.type,
                _size(device.memory_free),
                _size(device.memory_total),
                device.description,
            )
        )
    _table(rows)


@model.command("ps")
@api_host_option
@click.option(
    "--token", envvar="KRONK_TOKEN", help="Admin token, for a server with authentication on"
)
def model_ps(api_host: str | None, token: str | None) -> None:
    """List the models a running server has loaded: memory, slots, activity, TTL left."""
    pool = call_server(api_host or "127.0.0.1:8080", "GET", "/v1/kronk/models", token=token)
    rows = [("ID", "CAPABILITIES", "MEMORY", "SLOTS", "ACTIVE", "TTL LEFT")]
    for entry in pool["data"]:
        ttl = entry["ttl_left_seconds"]
        rows.append(
            (
                entry["id"],
                ",".join(entry["capabilities"]),
                _size(entry["memory_bytes"]),
                str(entry["slots"]),
                str(entry["active_requests"]),
                "never (kept)" if ttl is None else _duration(ttl),
            )
        )
    _table(rows)
    click.echo(f"{len(pool['data'])} of {pool['models_in_cache']} places in use")


@model.command("unload")
@click.argument("model_id")
@api_host_option
@click.option(
    "--token", envvar="KRONK_TOKEN", help="Admin token, for a server with authentication on"
)
def model_unload(model_id: str, api_host: str | None, token: str | None) -> None:
    """Unload a model from a running server now (requests still running on it fail)."""
    path = f"/v1/kronk/models/{urllib.parse.quote(model_id, safe='')}/unload"
    answer = call_server(api_host or "127.0.0.1:8080", "POST", path, token=token)
    click.echo(f"{model_id}: {'unloaded' if answer['unloaded'] else 'was not loaded'}")


def _table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        line = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        click.echo(line.rstrip())


def _size(count: int) -> str:
    return f"{count / 2**20:.1f} MiB"


def _count(number: int) -> str:
    """134515008 → 134.5M; 8190735360 → 8.2B."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if number >= scale:
            return f"{number / scale:.1f}{suffix}"
    return str(number)


def _duration(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{rest:02d}s" if hours else f"{minutes}m{rest:02d}s"


@main.command("run")
@click.argument("model_id", required=False)
@click.argument("prompt", nargs=-1)
@base_path_option
@model_config_option
@click.option("--verbose", is_flag=True, help="Show timings after each answer")
@click.option("--system", default=None, help="The system message")
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=None,
    envvar="KRONK_MAX_TOKENS",
    help="Stop an answer after this many tokens [the model's natural stop]",
)
@click.option("--temperature", type=float, default=None, envvar="KRONK_TEMPERATURE")
def run(
    model_id: str | None,
    prompt: tuple[str, ...],
    base_path: Path | None,
    model_config_file: Path | None,
    verbose: bool,
    system: str | None,
    max_tokens: int | None,
    temperature: float | None,
) -> None:
    """Chat with a model in the terminal (no server needed), as `ollama run`: /? lists the
    commands, Ctrl-C stops an answer, Ctrl-D or /bye quits.

    MODEL_ID may be a model file's path (`./x.gguf`) or a reference a plugin can pull
    (`org/repo:Q4_K_M`, pulled first). With a PROMPT, or a message piped in, it answers
    that and exits.
    """
    # llama.cpp's load chatter would interleave with the conversation.
    logging.getLogger("kronk.llama").setLevel(logging.ERROR)
    try:
        config = _local_config(base_path, model_config_file, model_id)
        kronk = Kronk(config)
        with _progress_lines():
            model_id = kronk.resolve(model_id, pull=True)
        with _spinner(f"loading {model_id}"):
            kronk.load(model_id)
    except KronkError as exc:
        _fail(exc)
    parameters: dict[str, Any] = {}
    if max_tokens is not None:
        parameters["max_tokens"] = max_tokens
    if temperature is not None:
        parameters["temperature"] = temperature
    chat = TerminalChat(kronk, model_id, verbose=verbose, parameters=parameters, system=system)
    try:
        if prompt or not sys.stdin.isatty():
            chat.ask(" ".join(prompt) if prompt else sys.stdin.read())
        else:
            interactive(chat, config.base_path / "history")
    finally:
        kronk.close()


@contextlib.contextmanager
def _progress_lines() -> Iterator[None]:
    """Show what the plugins log meanwhile (a pull's progress), as plain lines on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


class _spinner:
    """A spinner on stderr while something slow (a model load) runs."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        for frame in itertools.cycle("|/-\\"):
            if self._done.wait(0.1):
                break
            click.echo(f"\r{frame} {self._label}", nl=False, err=True)
        click.echo("\r" + " " * (len(self._label) + 2) + "\r", nl=False, err=True)

    def __enter__(self) -> _spinner:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()


if __name__ == "__main__":
    main()
