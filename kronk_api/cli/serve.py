"""The foreground server: the address taken first, the pid file, uvicorn behind the
timeouts and the connection guard, and a first signal that drains before it stops."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from types import FrameType
from typing import Any

import click

from kronk_api.cli.common import fail
from kronk_api.cli.process import pid_file_in
from kronk_api.drain import Drain
from kronk_api.listen import ListenError, listen
from kronk_api.logs import configure_logging
from kronk_api.settings import ServerSettings
from kronk_api.timeouts import HttpTimeouts
from kronk_core.contract.errors import KronkError

log = logging.getLogger(__name__)


def serve(settings: ServerSettings) -> None:
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
    pid_file_in(base).write_text(str(os.getpid()))
    try:
        _run(settings, sock)
    finally:
        pid_file_in(base).unlink(missing_ok=True)


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
        fail(exc)
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
