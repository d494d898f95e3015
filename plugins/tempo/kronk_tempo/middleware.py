"""ASGI middleware on the API server: one span per HTTP request, continuing a client's
W3C traceparent; health checks are not traced."""

from __future__ import annotations

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from opentelemetry import context, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kronk_api.endpoints import route_path
from kronk_core.events import current_request_id
from kronk_tempo.tracing import Tracing, current_tracing

STATE_KEY = "kronk_tempo"
UNTRACED = frozenset({"/v1/liveness", "/v1/readiness"})
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

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = message["status"]
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
            await send(message)

        try:
            await app(scope, receive, send_status)
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR))
            raise
        finally:
            current_tracing.reset(tracing_token)
            context.detach(attached)
            span.end()

    return middleware
