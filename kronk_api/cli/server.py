"""`kronk server start|stop|logs`."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import click

from kronk_api.bool_flags import BoolValueGroup
from kronk_api.cli.common import base_path_option, base_path_or_default, fail
from kronk_api.cli.process import is_kronk_process, log_file_in, pid_file_in, start_detached
from kronk_api.cli.serve import serve
from kronk_api.options import ServerStartCommand, cli_plugins, config_file_option
from kronk_api.settings import bind_sections, load_settings, server_sections
from kronk_core.contract.errors import KronkError


@click.group(cls=BoolValueGroup)
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
        fail(exc)
    if detach:
        start_detached(settings, command.schema, ready_timeout)
        return
    serve(settings)


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
    pid_file = pid_file_in(base_path_or_default(base_path))
    if not pid_file.exists():
        raise click.ClickException("no running server found (no pid file)")
    pid = int(pid_file.read_text())
    if not is_kronk_process(pid):
        pid_file.unlink(missing_ok=True)
        raise click.ClickException(f"server process {pid} is not running")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_kronk_process(pid):
            # uvicorn re-raises SIGTERM after its shutdown, so the server can't clean up.
            pid_file.unlink(missing_ok=True)
            click.echo(f"stopped server (pid {pid})")
            return
        time.sleep(0.1)
    raise click.ClickException(f"server (pid {pid}) did not exit within {timeout}s")


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
    log_file = log_file_in(base_path_or_default(base_path))
    if not log_file.exists():
        raise click.ClickException(f"no log file at {log_file}")
    for line in log_file.read_text(errors="replace").splitlines()[-lines:]:
        click.echo(line)
