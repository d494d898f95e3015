"""The `kronk` command line. Every setting's flag and KRONK_* variable follow one rule."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

import click

from kronk_api.client import call_server
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
)
from kronk_core import Kronk, KronkConfig
from kronk_core.config import ModelConfig, default_base_path, load_model_config_file
from kronk_core.errors import KronkError
from kronk_core.loading import model_config_for
from kronk_core.models import installed_model_files

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


def _local_config(base_path: Path | None, model_config_file: Path | None) -> KronkConfig:
    """SDK config for commands that work without a server (model list, run)."""
    models = load_model_config_file(model_config_file) if model_config_file else {}
    return KronkConfig(base_path=_base_path(base_path), models=models)


class KronkGroup(click.Group):
    """Lets plugins add sub-commands through the kronk_cli hook."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plugins_added = False

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
    help="Run in the background; logs go to the log file",
)
@click.pass_context
def server_start(ctx: click.Context, /, config_file: Path | None, detach: bool, **_: Any) -> None:
    """Start the model server.

    Every setting has a flag and a KRONK_* variable named after it (see
    --help); plugins add theirs for their own settings sections.
    """
    command = ctx.command
    assert isinstance(command, ServerStartCommand)
    try:
        settings = bind_sections(
            load_settings(config_file, command.overrides(ctx.params)), cli_plugins()
        )
    except KronkError as exc:
        _fail(exc)
    if detach:
        _start_detached(settings, command.schema)
        return
    _serve(settings)


def _serve(settings: ServerSettings) -> None:
    import uvicorn

    from kronk_api.app import create_app

    configure_logging(settings.log_level)
    try:
        app = create_app(settings)
    except KronkError as exc:
        _fail(exc)
    base = settings.base_path.expanduser()
    base.mkdir(parents=True, exist_ok=True)
    _pid_file(base).write_text(str(os.getpid()))
    try:
        # log_config=None: uvicorn's loggers propagate to the JSON handler.
        uvicorn.run(
            app,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            log_config=None,
        )
    finally:
        _pid_file(base).unlink(missing_ok=True)


def _start_detached(settings: ServerSettings, schema: list[Setting]) -> None:
    base = settings.base_path.expanduser()
    log_file = _log_file(base)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    environment = {**os.environ, **environment_for(settings, schema)}
    environment.pop("KRONK_DETACH", None)  # the child must run in the foreground
    with log_file.open("ab") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "kronk_api.cli", "server", "start"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=environment,
            start_new_session=True,
        )
    click.echo(f"kronk server started in the background (pid {process.pid}) on {settings.api_host}")
    click.echo(f"logs: {log_file}")


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
    """Models: list them, see what a server has loaded (plugins add more: pull)."""


@model.command("list")
@base_path_option
@model_config_option
def model_list(base_path: Path | None, model_config_file: Path | None) -> None:
    """List configured, installed and default models."""
    try:
        config = _local_config(base_path, model_config_file)
        with Kronk(config) as kronk:
            provided = kronk.provided_models()
            model_ids = kronk.model_ids()
    except KronkError as exc:
        _fail(exc)
    files = installed_model_files(config)
    for model_id in model_ids:
        configured = config.model(model_id)
        where = (
            configured.model_path
            if configured and configured.model_path
            else provided.get(model_id, {}).get("model_path") or files.get(model_id)
        )
        click.echo(f"{model_id}\t{where or 'embedded default'}")


@model.command("show")
@click.argument("model_id", required=False)
@base_path_option
@model_config_option
def model_show(
    model_id: str | None, base_path: Path | None, model_config_file: Path | None
) -> None:
    """Show a model's file and settings, and what loading it would take (memory estimate)."""
    try:
        kronk = Kronk(_local_config(base_path, model_config_file))
        model_id = model_id or kronk.config.default_model
        config = model_config_for(kronk, model_id)
        estimate = kronk.memory_estimate(model_id)
    except KronkError as exc:
        _fail(exc)
    click.echo(f"model:           {model_id}")
    click.echo(f"file:            {config.model_path}")
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
                "never" if ttl is None else _duration(ttl),
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


def _duration(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{rest:02d}s" if hours else f"{minutes}m{rest:02d}s"


@main.command("run")
@click.argument("model_id", required=False)
@base_path_option
@model_config_option
@click.option("--max-tokens", default=512, show_default=True, envvar="KRONK_MAX_TOKENS")
@click.option("--temperature", type=float, default=None, envvar="KRONK_TEMPERATURE")
def run(
    model_id: str | None,
    base_path: Path | None,
    model_config_file: Path | None,
    max_tokens: int,
    temperature: float | None,
) -> None:
    """Chat with a model in the terminal (no server needed). Ctrl-D or /exit quits."""
    # llama.cpp's load chatter would interleave with the conversation.
    logging.getLogger("kronk.llama").setLevel(logging.ERROR)
    try:
        config = _local_config(base_path, model_config_file)
        kronk = Kronk(config)
        with _spinner(f"loading {model_id or config.default_model}"):
            kronk.load(model_id)
    except KronkError as exc:
        _fail(exc)
    sampling = {} if temperature is None else {"temperature": temperature}
    history: list[dict[str, str]] = []
    try:
        while True:
            try:
                line = input(">>> ")
            except EOFError:
                break
            if line.strip() in ("/exit", "/quit"):
                break
            if not line.strip():
                continue
            history.append({"role": "user", "content": line})
            answer = asyncio.run(_stream_answer(kronk, model_id, history, max_tokens, sampling))
            history.append({"role": "assistant", "content": answer})
    finally:
        kronk.close()


async def _stream_answer(
    kronk: Kronk,
    model_id: str | None,
    history: list[dict[str, str]],
    max_tokens: int,
    sampling: dict[str, float],
) -> str:
    parts: list[str] = []
    try:
        async for delta in kronk.chat_stream(
            history, model=model_id, max_tokens=max_tokens, **sampling
        ):
            if delta.content:
                parts.append(delta.content)
                click.echo(delta.content, nl=False)
    except KronkError as exc:
        click.echo(f"\nerror: {exc.message}", err=True)
    click.echo()
    return "".join(parts)


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
