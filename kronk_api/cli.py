"""The `kronk` command line. Every flag has a KRONK_* environment variable."""

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
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NoReturn

import click

from kronk_api.logs import configure_logging
from kronk_api.settings import ServerSettings, load_settings
from kronk_core import Kronk, KronkConfig
from kronk_core.config import default_base_path, load_model_config_file
from kronk_core.errors import KronkError
from kronk_core.models import installed_model_files, known_model_ids, resolve_model_config
from kronk_core.plugins import create_plugin_manager

# Flag → settings key; the environment variable names follow the Kronk manual.
SERVER_OPTIONS = {
    "api_host": "KRONK_WEB_API_HOST",
    "base_path": "KRONK_BASE_PATH",
    "model": "KRONK_MODEL",
    "model_config_file": "KRONK_CATALOG_MODEL_CONFIG_FILE",
    "preload": "KRONK_PRELOAD",
    "queue_wait_seconds": "KRONK_QUEUE_WAIT_SECONDS",
    "models_in_cache": "KRONK_MODELS_IN_CACHE",
    "cache_ttl": "KRONK_CACHE_TTL",
    "log_level": "KRONK_LOG_LEVEL",
    "insecure_logging": "KRONK_INSECURE_LOGGING",
    "cors_origins": "KRONK_CORS_ORIGINS",
    "max_request_bytes": "KRONK_MAX_REQUEST_BYTES",
    "json_max_depth": "KRONK_JSON_MAX_DEPTH",
    "json_max_string_length": "KRONK_JSON_MAX_STRING_LENGTH",
    "json_max_items": "KRONK_JSON_MAX_ITEMS",
    "auth_enabled": "KRONK_AUTH_ENABLED",
    "auth_issuer": "KRONK_AUTH_ISSUER",
    "auth_limit_store": "KRONK_AUTH_LIMIT_STORE",
}


api_host_option = click.option(
    "--api-host", envvar="KRONK_WEB_API_HOST", help="HOST:PORT of the server [127.0.0.1:8080]"
)
base_path_option = click.option(
    "--base-path",
    envvar="KRONK_BASE_PATH",
    type=click.Path(path_type=Path),
    help="Base directory for Kronk data [~/.kronk]",
)
model_config_option = click.option(
    "--model-config-file",
    envvar="KRONK_CATALOG_MODEL_CONFIG_FILE",
    type=click.Path(path_type=Path),
    help="YAML file with per-model settings",
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
            create_plugin_manager().hook.kronk_cli(group=self)

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


@server.command("start")
@api_host_option
@base_path_option
@click.option("--model", envvar="KRONK_MODEL", help="Default model id")
@model_config_option
@click.option(
    "--preload/--no-preload",
    default=None,
    envvar="KRONK_PRELOAD",
    help="Load the default model at start instead of on first use",
)
@click.option(
    "--queue-wait-seconds",
    type=float,
    envvar="KRONK_QUEUE_WAIT_SECONDS",
    help="How long a request waits for queue space before 429 [30]",
)
@click.option(
    "--models-in-cache",
    type=int,
    # The manual names both; KRONK_MODELS_IN_CACHE comes first.
    envvar=["KRONK_MODELS_IN_CACHE", "KRONK_CACHE_MODELS_IN_CACHE"],
    help="Most models kept loaded at once [3]",
)
@click.option(
    "--cache-ttl",
    envvar="KRONK_CACHE_TTL",
    help="How long an idle model stays loaded, e.g. 90s, 20m, 1h; 0 = until evicted [20m]",
)
@click.option(
    "--log-level",
    envvar="KRONK_LOG_LEVEL",
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="Log level [info]",
)
@click.option(
    "--insecure-logging/--no-insecure-logging",
    default=None,
    envvar="KRONK_INSECURE_LOGGING",
    help="Also log request bodies (prompts) and unhandled errors' messages [off]",
)
@click.option(
    "--cors-origins",
    envvar="KRONK_CORS_ORIGINS",
    help="Comma-separated origins browsers may call from [none: same origin only]",
)
@click.option(
    "--max-request-bytes",
    type=int,
    envvar="KRONK_MAX_REQUEST_BYTES",
    help="Largest request body; larger is 413 [33554432]",
)
@click.option(
    "--json-max-depth",
    type=int,
    envvar="KRONK_JSON_MAX_DEPTH",
    help="Deepest JSON nesting in a request body [64]",
)
@click.option(
    "--json-max-string-length",
    type=int,
    envvar="KRONK_JSON_MAX_STRING_LENGTH",
    help="Longest JSON string in a request body, in characters [25165824]",
)
@click.option(
    "--json-max-items",
    type=int,
    envvar="KRONK_JSON_MAX_ITEMS",
    help="Most items in one JSON array or object of a request body [100000]",
)
@click.option(
    "--auth-enabled/--no-auth-enabled",
    default=None,
    envvar="KRONK_AUTH_ENABLED",
    help="Require a bearer token on every endpoint but health checks [off]",
)
@click.option("--auth-issuer", envvar="KRONK_AUTH_ISSUER", help="JWT issuer (iss) [kronk]")
@click.option(
    "--auth-limit-store",
    envvar="KRONK_AUTH_LIMIT_STORE",
    help="Rate-limit counters: sqlite, sqlite:///PATH or redis://HOST:PORT/DB [sqlite]",
)
@click.option(
    "--config",
    "config_file",
    envvar="KRONK_CONFIG",
    type=click.Path(path_type=Path),
    help="YAML file with server settings (flags and environment override it)",
)
@click.option(
    "-d",
    "--detach",
    is_flag=True,
    envvar="KRONK_DETACH",
    help="Run in the background; logs go to the log file",
)
def server_start(config_file: Path | None, detach: bool, **options: Any) -> None:
    """Start the model server."""
    overrides = {key: value for key, value in options.items() if value is not None}
    try:
        settings = load_settings(config_file, overrides)
    except KronkError as exc:
        _fail(exc)
    if detach:
        _start_detached(settings)
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


def _start_detached(settings: ServerSettings) -> None:
    base = settings.base_path.expanduser()
    log_file = _log_file(base)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    environment = {**os.environ, **_environment_for(settings)}
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


def _environment_for(settings: ServerSettings) -> dict[str, str]:
    values = settings.model_dump(exclude_none=True)
    return {SERVER_OPTIONS[key]: _environment_value(value) for key, value in values.items()}


def _environment_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(value)
    return str(value)


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


@main.group()
def model() -> None:
    """Inspect models."""


@model.command("list")
@base_path_option
@model_config_option
def model_list(base_path: Path | None, model_config_file: Path | None) -> None:
    """List configured, installed and default models."""
    try:
        config = _local_config(base_path, model_config_file)
    except KronkError as exc:
        _fail(exc)
    files = installed_model_files(config)
    for model_id in known_model_ids(config):
        configured = config.model(model_id)
        where = (
            configured.model_path if configured and configured.model_path else files.get(model_id)
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
        config = resolve_model_config(kronk.config, model_id)
        estimate = kronk.memory_estimate(model_id)
    except KronkError as exc:
        _fail(exc)
    click.echo(f"model:           {model_id}")
    click.echo(f"file:            {config.model_path}")
    settings = config.model_dump(exclude_defaults=True, exclude={"id", "model_path"})
    for key, value in settings.items():
        click.echo(f"{key + ':':<17}{value}")
    if estimate is None:
        click.echo("memory estimate: not available from its backend")
        return
    click.echo(
        f"memory estimate: {_size(estimate.total_bytes)} = weights {_size(estimate.weights_bytes)}"
        f" + KV cache {_size(estimate.kv_bytes)}"
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
def model_ps(api_host: str | None) -> None:
    """List the models a running server has loaded: memory, slots, activity, TTL left."""
    url = f"http://{api_host or '127.0.0.1:8080'}/v1/kronk/models"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            pool = json.load(response)
    except (urllib.error.URLError, OSError) as exc:
        raise click.ClickException(f"cannot reach the server at {url}: {exc}") from None
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


def _table(rows: list[tuple[str, ...]]) -> None:
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
