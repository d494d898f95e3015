"""create_app: the Litestar app composed from what the active plugins contribute."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterable
from functools import partial
from typing import Any

from litestar import Litestar, Request, Response, get
from litestar.exceptions import HTTPException

from kronk_api.admin import ADMIN_ROUTES
from kronk_api.logs import request_ids
from kronk_api.settings import ServerSettings
from kronk_core import Kronk, __version__

log = logging.getLogger(__name__)

_ERROR_TYPES = {404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error"}


@get("/v1/liveness")
async def liveness() -> dict[str, Any]:
    return {"status": "up", "version": __version__, "host": socket.gethostname()}


@get("/v1/readiness")
async def readiness(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    kronk: Kronk = request.app.state.kronk
    loaded = kronk.get_loaded()
    if loaded is None or not loaded.engine.alive:
        return Response(
            {"status": "not ready", "model": kronk.config.default_model}, status_code=503
        )
    return Response({"status": "ready", "model": loaded.id})


def _http_error(_: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    status = exc.status_code
    body = {
        "error": {
            "message": exc.detail,
            "type": _ERROR_TYPES.get(
                status, "invalid_request_error" if status < 500 else "server_error"
            ),
            "code": str(status),
            "param": None,
        }
    }
    return Response(body, status_code=status, headers=exc.headers)


def _internal_error(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    body = {
        "error": {
            "message": "internal server error",
            "type": "server_error",
            "code": "internal",
            "param": None,
        }
    }
    return Response(body, status_code=500)


def _flatten(results: Iterable[Iterable[Any]]) -> list[Any]:
    return [item for result in results for item in result]


def create_app(settings: ServerSettings | None = None, *, kronk: Kronk | None = None) -> Litestar:
    """Compose the server.

    `kronk` may be given to share an SDK instance (tests, embedding); its own
    config then rules models and queueing, and `settings` only the server.
    """
    settings = settings or ServerSettings()
    kronk = kronk or Kronk(settings.kronk_config())
    hook = kronk.hook
    handlers: dict[Any, Any] = {HTTPException: _http_error, Exception: _internal_error}
    for extra in hook.kronk_exception_handlers(kronk=kronk):
        handlers.update(extra)

    async def startup() -> None:
        if settings.preload:
            # keep: the model readiness reports on does not expire with cache_ttl.
            await asyncio.to_thread(partial(kronk.load, settings.model, keep=True))
        hook.kronk_startup(kronk=kronk)

    async def shutdown() -> None:
        hook.kronk_shutdown(kronk=kronk)
        await asyncio.to_thread(kronk.close)

    app = Litestar(
        route_handlers=[
            liveness,
            readiness,
            *ADMIN_ROUTES,
            *_flatten(hook.kronk_routes(kronk=kronk)),
        ],
        guards=_flatten(hook.kronk_guards(kronk=kronk)),
        middleware=[request_ids, *_flatten(hook.kronk_middleware(kronk=kronk))],
        exception_handlers=handlers,
        on_startup=[startup],
        on_shutdown=[shutdown],
        openapi_config=None,
        logging_config=None,  # the CLI (or the embedding program) configures logging
    )
    app.state.kronk = kronk
    app.state.settings = settings
    return app
