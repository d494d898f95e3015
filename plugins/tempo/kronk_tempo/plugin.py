"""Hook implementations of the tempo plugin."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from litestar import Litestar
from litestar.types import Middleware
from opentelemetry import trace

from kronk_core import Kronk, hookimpl
from kronk_core.config import ModelConfig
from kronk_core.events import ChatRecord
from kronk_core.sections import Section
from kronk_tempo.middleware import STATE_KEY, trace_requests
from kronk_tempo.settings import SETTINGS
from kronk_tempo.tracing import Tracing, current_tracing, record_chat, record_load


class SpanWriter:
    """Registered with a server's plugin manager while it traces: writes the engine's spans
    under the HTTP span of the request they belong to."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing

    def _http_span(self) -> trace.Span | None:
        if current_tracing.get() is not self.tracing:
            return None  # another server's request, or none
        span = trace.get_current_span()
        return span if span.is_recording() else None

    @hookimpl
    def kronk_chat_finished(self, record: ChatRecord) -> None:
        span = self._http_span()
        if span is not None:
            record_chat(self.tracing.tracer, span, record)

    @hookimpl
    def kronk_model_loaded(self, model_config: ModelConfig, seconds: float) -> None:
        span = self._http_span()
        if span is not None:
            record_load(self.tracing.tracer, span, model_config.id, seconds)


@hookimpl
def kronk_settings() -> Sequence[Section[Any]]:
    return [SETTINGS]


@hookimpl
def kronk_middleware(kronk: Kronk) -> Sequence[Middleware]:
    return [trace_requests]


# Last: once every other plugin has started (a failing one stops the server first).
@hookimpl(trylast=True)
def kronk_startup(kronk: Kronk, app: Litestar) -> None:
    settings = SETTINGS.of(app.state.settings)
    if settings.host is None:
        return
    tracing = Tracing.create(settings)
    kronk.plugins.register(SpanWriter(tracing), name=_writer_name(app))
    app.state[STATE_KEY] = tracing


@hookimpl
def kronk_shutdown(kronk: Kronk, app: Litestar) -> None:
    tracing: Tracing | None = app.state.pop(STATE_KEY, None)
    if tracing is None:
        return
    kronk.plugins.unregister(name=_writer_name(app))
    tracing.shutdown()


def _writer_name(app: Litestar) -> str:
    return f"tempo-spans-{id(app)}"
