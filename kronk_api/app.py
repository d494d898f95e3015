"""create_app: the Litestar app composed from what the active plugins contribute."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterable
from functools import partial
from typing import Any

from litestar import Litestar, Request, Response, get
from litestar.config.cors import CORSConfig

from kronk_api.admin import ADMIN_ROUTES
from kronk_api.affinity import affinity
from kronk_api.body_limits import BodyLimits, body_guard
from kronk_api.dialect import Dialect
from kronk_api.drain import Drain, load_of
from kronk_api.endpoints import ENDPOINT_OPT, PUBLIC
from kronk_api.logs import request_ids
from kronk_api.settings import ServerSettings, bind_sections
from kronk_core import Kronk, __version__
from kronk_core.errors import KronkError
from kronk_core.pool import LoadState

log = logging.getLogger(__name__)

# The server's own routes (health, admin) and unknown paths answer in OpenAI's shape.
SERVER_DIALECT = Dialect()


@get("/v1/liveness", opt={ENDPOINT_OPT: PUBLIC})
async def liveness() -> dict[str, Any]:
    return {"status": "up", "version": __version__, "host": socket.gethostname()}


@get("/v1/readiness", opt={ENDPOINT_OPT: PUBLIC})
async def readiness(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    """200 while the server accepts requests, whether or not its default model is loaded yet.

    503 when a balancer should send new work elsewhere: the server is draining or
    shutting down, the model's engine has stopped, the model's last load failed, or
    every loaded model has all its slots busy and a full queue. The body's `load` and
    the X-Kronk-Load header carry the slots and queue either way.
    """
    kronk: Kronk = request.app.state.kronk
    drain: Drain = request.app.state.drain
    model_id = kronk.canonical(kronk.config.default_model)
    state, failure = kronk.pool.state(model_id)
    load = load_of(kronk)
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
    elif load.saturated:
        body["status"] = "busy"
    return Response(
        body,
        status_code=200 if body["status"] == "ready" else 503,
        headers={"X-Kronk-Load": load.header()},
    )


def _engine_running(kronk: Kronk, model_id: str) -> bool:
    loaded = kronk.get_loaded(model_id)
    return loaded is None or loaded.engine.alive  # an embedding model has no engine


def _flatten(results: Iterable[Iterable[Any]]) -> list[Any]:
    return [item for result in results for item in result]


def create_app(settings: ServerSettings | None = None, *, kronk: Kronk | None = None) -> Litestar:
    """Compose the server.

    `kronk` may be given to share an SDK instance (tests, embedding); its own
    config then rules models and queueing, and `settings` only the server.
    """
    settings = settings or ServerSettings()
    kronk = kronk or Kronk(settings.kronk_config())
    settings = bind_sections(settings, kronk.plugins)
    hook = kronk.hook
    handlers = SERVER_DIALECT.exception_handlers()
    for extra in hook.kronk_exception_handlers(kronk=kronk):
        handlers.update(extra)

    async def startup() -> None:
        if settings.preload:
            # keep: the model readiness reports on does not expire with cache_ttl.
            await asyncio.to_thread(partial(kronk.load, settings.model, keep=True))
        hook.kronk_startup(kronk=kronk, app=app)

    async def shutdown() -> None:
        hook.kronk_shutdown(kronk=kronk, app=app)
        await asyncio.to_thread(kronk.close)

    limits = BodyLimits(
        max_bytes=settings.max_request_bytes,
        max_depth=settings.json_max_depth,
        max_string_length=settings.json_max_string_length,
        max_items=settings.json_max_items,
        log_bodies=settings.insecure_logging,
    )
    drain = Drain()
    app = Litestar(
        route_handlers=[
            liveness,
            readiness,
            *ADMIN_ROUTES,
            *_flatten(hook.kronk_routes(kronk=kronk)),
        ],
        # The body is read and checked after the plugins' guards (authentication).
        guards=[*_flatten(hook.kronk_guards(kronk=kronk)), body_guard(limits)],
        middleware=[
            drain.middleware,
            request_ids,
            affinity(settings.api_host),
            *_flatten(hook.kronk_middleware(kronk=kronk)),
        ],
        exception_handlers=handlers,
        # Without origins, no CORS headers: browsers allow the same origin only.
        cors_config=CORSConfig(allow_origins=settings.cors_origins)
        if settings.cors_origins
        else None,
        request_max_body_size=settings.max_request_bytes,
        on_startup=[startup],
        on_shutdown=[shutdown],
        openapi_config=None,
        logging_config=None,  # the CLI (or the embedding program) configures logging
    )
    app.state.kronk = kronk
    app.state.settings = settings
    app.state.drain = drain
    return app
