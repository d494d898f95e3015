"""ASGI middleware on the API server: count and time every routed request (counted
just before its last byte leaves, so a client that has its answer sees it counted)."""

from __future__ import annotations

import time

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send

from kronk_api.contract import ResponseWatch, endpoint_name
from kronk_debug.metrics import Metrics, RequestLabels, current_labels

STATE_KEY = "kronk_debug"


def metrics_of(scope: Scope) -> Metrics | None:
    state = scope["app"].state.get(STATE_KEY)
    return None if state is None else state.metrics


def count_requests(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        metrics = metrics_of(scope) if scope["type"] == ScopeType.HTTP else None
        if metrics is None:
            await app(scope, receive, send)
            return
        labels = RequestLabels(metrics, endpoint_name(scope))
        token = current_labels.set(labels)
        began = time.perf_counter()

        def done(status: int) -> None:
            metrics.observe_request(labels, status, time.perf_counter() - began)

        watch = ResponseWatch(send, done)
        try:
            await app(scope, receive, watch.send)
        finally:
            current_labels.reset(token)
            watch.finish()

    return middleware
