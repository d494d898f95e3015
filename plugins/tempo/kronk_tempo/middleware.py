"""ASGI middleware on the API server: one span per HTTP request, continuing a client's
W3C traceparent; health checks are not traced. The span ends just before the
response's last byte leaves, so a client holding its answer finds the span exported
by the next flush."""

from __future__ import annotations

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send
from opentelemetry import context, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kronk_api.contract import ResponseWatch, route_path
from kronk_core.contract import current_request_id
from kronk_tempo.tracing import Tracing, current_tracing

STATE_KEY = "kronk_tempo"
UNTRACED = frozenset({"/v1/liveness", "/v1/readiness", "/health", "/v1/health"})
_PROPAGATOR = TraceContextTextMapPropagator()


def tracing_of(scope: Scope) -> Tracing | None:
    if scope["type"] != ScopeType.HTTP or scope["path"] in UNTRACED:
        return None
    tracing: Tracing | None = scope["app"].state.get(STATE_KEY)
    return tracing


def trace_requests(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        tracing = tracing_of(scope)
        if tracing is None:
            await app(scope, receive, send)
            return
        headers = {key.decode("latin-1"): item.decode("latin-1") for key, item in scope["headers"]}
        route = route_path(scope)
        method = str(scope.get("method", ""))
        span = tracing.tracer.start_span(
            f"{method} {route}",
            context=_PROPAGATOR.extract(headers),
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": method,
                "http.route": route,
                "url.path": scope["path"],
                "kronk.request_id": current_request_id.get() or "",
            },
        )
        attached = context.attach(trace.set_span_in_context(span))
        tracing_token = current_tracing.set(tracing)

        def done(status: int) -> None:
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR))
            span.end()

        watch = ResponseWatch(send, done)
        try:
            await app(scope, receive, watch.send)
        except BaseException as exc:
            # Its type only: an exception's message may quote the request.
            if span.is_recording():
                span.add_event("exception", {"exception.type": type(exc).__qualname__})
            raise
        finally:
            current_tracing.reset(tracing_token)
            context.detach(attached)
            watch.finish()

    return middleware
