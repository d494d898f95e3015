"""create_app: the Litestar app composed from what the active plugins contribute."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from litestar import Litestar, Request, Response, get
from litestar.config.app import AppConfig
from litestar.config.cors import CORSConfig

from kronk_api.admin import ADMIN_ROUTES
from kronk_api.affinity import affinity
from kronk_api.body_limits import BodyLimits, body_guard
from kronk_api.dialect import KronkDialect
from kronk_api.drain import Drain, Load, load_of
from kronk_api.endpoints import ENDPOINT_OPT, PUBLIC
from kronk_api.listening import log_summary
from kronk_api.logs import request_ids
from kronk_api.settings import ServerSettings, bind_sections
from kronk_core import Kronk, __version__
from kronk_core.contract.errors import KronkError
from kronk_core.runtime.pool import LoadState

log = logging.getLogger(__name__)

# The server's own routes (health, admin) and unknown paths answer in OpenAI's shape.
SERVER_DIALECT = KronkDialect()


@get("/v1/liveness", opt={ENDPOINT_OPT: PUBLIC})
async def liveness() -> dict[str, Any]:
    """Whether the process answers: 200 while it runs, loaded models or not."""
    return {"status": "up", "version": __version__, "host": socket.gethostname()}


@get("/v1/readiness", opt={ENDPOINT_OPT: PUBLIC})
async def readiness(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    """Whether to send this server new work: 200 while it accepts requests, its default model
    loaded or not; 503 while it drains or shuts down, when the model's last load failed or its
    engine stopped or hangs, or when every slot and the queue are full. The body and the
    X-Kronk-Load header carry the slots and queue either way."""
    body, load = _readiness(request)
    return Response(
        body,
        status_code=200 if body["status"] == "ready" else 503,
        headers={"X-Kronk-Load": load.header()},
    )


@get(["/health", "/v1/health"], opt={ENDPOINT_OPT: PUBLIC})
async def health(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    """llama-server's health check, for the tools that probe it: 200 `{"status": "ok"}`
    when readiness is 200, else 503 in llama-server's error shape, saying why."""
    body, _ = _readiness(request)
    if body["status"] == "ready":
        return Response({"status": "ok"}, status_code=200)
    why = body["status"] if "error" not in body else f"{body['status']}: {body['error']}"
    error = {"code": 503, "message": why, "type": "unavailable_error"}
    return Response({"error": error}, status_code=503)


def _readiness(request: Request[Any, Any, Any]) -> tuple[dict[str, Any], Load]:
    """Readiness: 200 while the server accepts requests, whether or not its default model is
    loaded yet.

    503 when a balancer should send new work elsewhere: the server is draining or
    shutting down, the model's engine has stopped, the model's last load failed, a
    loaded model's engine has been in one step longer than `engine_step_deadline` (it
    hangs: its requests wait), or every loaded model has all its slots busy and a full
    queue. The body's `load` and the X-Kronk-Load header carry the slots and queue
    either way.
    """
    kronk: Kronk = request.app.state.kronk
    drain: Drain = request.app.state.drain
    settings: ServerSettings = request.app.state.settings
    model_id = kronk.models.canonical()
    state, failure = kronk.pool.state(model_id)
    load = load_of(kronk)
    stuck = _stuck_engine(kronk, settings.engine_step_deadline)
    body: dict[str, Any] = {
        "status": "ready",
        "model": model_id,
        "model_state": state.value,
        "load": load.as_dict(),
    }
    if kronk.pool.closed:
        body["status"] = "shutting down"
    elif drain.draining:
        body["status"] = "draining"
    elif state is LoadState.failed:
        body["status"] = "not ready"
        body["error"] = failure.code if isinstance(failure, KronkError) else "model_load_failed"
    elif state is LoadState.loaded and not _engine_running(kronk, model_id):
        body.update(status="not ready", model_state="stopped")
    elif stuck is not None:
        stuck_model, seconds = stuck
        body.update(
            status="not ready",
            error="engine_stuck",
            stuck_model=stuck_model,
            stuck_seconds=round(seconds, 1),
        )
    elif load.saturated:
        body["status"] = "busy"
    return body, load


def _engine_running(kronk: Kronk, model_id: str) -> bool:
    loaded = kronk.get_loaded(model_id)
    return loaded is None or loaded.engine.alive  # an embedding model has no engine


def _stuck_engine(kronk: Kronk, deadline: float) -> tuple[str, float] | None:
    """The loaded model whose engine has been in one step the longest, past `deadline`
    seconds, and for how long; None if none is."""
    now = time.monotonic()
    longest: tuple[str, float] | None = None
    for loaded in kronk.loaded_models():
        started = loaded.engine.step_started
        if started is None or not loaded.engine.alive:
            continue
        seconds = now - started
        if seconds > deadline and (longest is None or seconds > longest[1]):
            longest = (loaded.id, seconds)
    return longest


def create_app(settings: ServerSettings | None = None, *, kronk: Kronk | None = None) -> Litestar:
    """Compose the server.

    `kronk` may be given to share an SDK instance (tests, embedding); its own
    config then rules models and queueing, and `settings` only the server.
    """
    settings = settings or ServerSettings()
    kronk = kronk or Kronk(settings.kronk_config())
    settings = bind_sections(settings, kronk.plugins)

    @asynccontextmanager
    async def models(app: Litestar) -> AsyncIterator[None]:
        """The server's own lifespan, around every plugin's: models load first (with
        --preload) and unload last."""
        try:
            if settings.preload:
                # keep: the model readiness reports on does not expire with cache_ttl.
                await asyncio.to_thread(partial(kronk.load, settings.model, keep=True))
            yield
        finally:
            await asyncio.to_thread(kronk.close)

    limits = BodyLimits(
        max_bytes=settings.max_request_bytes,
        max_depth=settings.json_max_depth,
        max_string_length=settings.json_max_string_length,
        max_items=settings.json_max_items,
        log_bodies=settings.insecure_logging,
    )
    drain = Drain()
    config = AppConfig(
        route_handlers=[liveness, readiness, health, *ADMIN_ROUTES],
        middleware=[drain.middleware, request_ids, affinity(settings.api_host)],
        exception_handlers=SERVER_DIALECT.exception_handlers(),
        lifespan=[models],
        # Without origins, no CORS headers: browsers allow the same origin only.
        cors_config=CORSConfig(allow_origins=settings.cors_origins)
        if settings.cors_origins
        else None,
        request_max_body_size=settings.max_request_bytes,
        openapi_config=None,
        logging_config=None,  # the CLI (or the embedding program) configures logging
    )
    kronk.hook.kronk_app(app_config=config, kronk=kronk)
    # After every lifespan (the plugins' ports are open): one line of what runs where.
    config.on_startup.append(log_summary)
    # The body is read and checked after the plugins' guards (authentication).
    config.guards.append(body_guard(limits))
    app = Litestar.from_config(config)
    app.state.kronk = kronk
    app.state.settings = settings
    app.state.drain = drain
    return app
