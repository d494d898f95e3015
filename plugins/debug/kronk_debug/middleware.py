"""ASGI middleware on the API server: count and time every routed request."""

from __future__ import annotations

import time

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from kronk_api.endpoints import endpoint_name
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
        status = 500  # what the server answers when the handler raises past everything

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        began = time.perf_counter()
        try:
            await app(scope, receive, send_status)
        finally:
            current_labels.reset(token)
            metrics.observe_request(labels, status, time.perf_counter() - began)

    return middleware
