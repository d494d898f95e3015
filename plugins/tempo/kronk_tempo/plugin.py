"""Hook implementations of the tempo plugin."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar
from litestar.config.app import AppConfig
from opentelemetry import trace

from kronk_core import hookimpl
from kronk_core.contract import ChatRecord, KronkView, ModelConfig, Section
from kronk_tempo.middleware import STATE_KEY, trace_requests
from kronk_tempo.settings import SETTINGS, with_otel_environment
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


# Last: its lifespan starts once every other plugin's has (a failing one stops the server
# first), and stops first.
@hookimpl(trylast=True)
def kronk_app(app_config: AppConfig, kronk: KronkView) -> None:
    app_config.middleware.append(trace_requests)

    @asynccontextmanager
    async def tracing(app: Litestar) -> AsyncIterator[None]:
        settings = with_otel_environment(SETTINGS.of(app.state.settings), os.environ)
        if settings.host is None:
            yield
            return
        found = app.state[STATE_KEY] = Tracing.create(settings)
        try:
            with kronk.subscribe(SpanWriter(found)):
                yield
        finally:
            found.shutdown()

    app_config.lifespan.append(tracing)
