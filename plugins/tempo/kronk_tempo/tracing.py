"""A server's tracer, its OTLP exporter, and the spans of one chat request.

The span tree of a chat request (docs/observability.md):

    POST /v1/chat/completions          the HTTP request (middleware)
    ├── model-file-load-time           when the request had to load its model
    ├── prepare-request                model lease, then the prompt
    │   └── create-prompt              chat template and tokenization
    ├── queue-wait                     queued until a slot takes it
    ├── process-request                in the engine, slot taken to last token
    │   ├── process-cache              cache lookup and restore into the slot
    │   ├── prefill                    the prompt tokens the cache did not hold
    │   ├── first-token                sampling the first token
    │   └── token-generation           the decode loop
    └── tool-call-parsing              when the request offered tools

Engine spans are written after the fact from the records' timestamps, so the
engine thread never touches OpenTelemetry.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, Tracer
from opentelemetry.util.types import Attributes

from kronk_core.contract import ChatRecord, ConfigError, RequestRecord
from kronk_tempo.settings import SETTINGS, TempoSettings

# What the `grpc` extra installs, the exporter and grpcio under it: a missing module named so.
_GRPC_MODULES = ("opentelemetry.exporter.otlp.proto.grpc", "grpc")


def exporter_for(settings: TempoSettings) -> SpanExporter:
    """OTLP over gRPC (HOST:PORT, plain text unless the URL says https) or HTTP/protobuf."""
    assert settings.host is not None
    target = settings.host if "://" in settings.host else f"http://{settings.host}"
    url = urlsplit(target)
    if settings.protocol == "grpc":
        # An extra (grpcio is large): the HTTP exporter needs none.
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith(_GRPC_MODULES):
                raise
            raise ConfigError(
                f"{SETTINGS.name}.protocol",
                "grpc needs the OTLP gRPC exporter: pip install 'kronk-tempo[grpc]', "
                "or export over http (--tempo-protocol http, port 4318)",
            ) from None
        return GrpcExporter(endpoint=url.netloc, insecure=url.scheme != "https")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    path = url.path if url.path not in ("", "/") else "/v1/traces"
    return HttpExporter(endpoint=f"{url.scheme}://{url.netloc}{path}")


@dataclass
class Tracing:
    """One server's tracer provider; spans go to `processor` (batched OTLP export)."""

    provider: TracerProvider
    tracer: Tracer

    @classmethod
    def create(cls, settings: TempoSettings, processor: SpanProcessor | None = None) -> Tracing:
        provider = TracerProvider(
            resource=Resource.create({"service.name": settings.service_name}),
            sampler=ParentBased(TraceIdRatioBased(settings.probability)),
        )
        provider.add_span_processor(processor or BatchSpanProcessor(exporter_for(settings)))
        return cls(provider, provider.get_tracer("kronk"))

    def flush(self) -> None:
        self.provider.force_flush()

    def shutdown(self) -> None:
        self.provider.shutdown()


# The Tracing whose HTTP span is current in this request (set by the middleware).
current_tracing: ContextVar[Tracing | None] = ContextVar("kronk_tracing", default=None)


class _Clock:
    """Monotonic seconds (the records' clock) to epoch nanoseconds (OpenTelemetry's)."""

    def __init__(self) -> None:
        self._offset = time.time_ns() - time.monotonic_ns()

    def ns(self, monotonic: float) -> int:
        return int(monotonic * 1e9) + self._offset


def _child(
    tracer: Tracer,
    parent: Span,
    name: str,
    start: int,
    end: int,
    attributes: Attributes = None,
) -> Span:
    span = tracer.start_span(
        name, context=trace.set_span_in_context(parent), start_time=start, attributes=attributes
    )
    span.end(end_time=max(start, end))
    return span


def record_chat(tracer: Tracer, http_span: Span, record: ChatRecord) -> None:
    """The spans of one chat request under its HTTP span (see the module docstring)."""
    clock = _Clock()
    usage = record.usage
    http_span.set_attributes(
        {
            "gen_ai.request.model": record.model,
            "gen_ai.usage.input_tokens": usage.prompt_tokens,
            "gen_ai.usage.output_tokens": usage.completion_tokens,
            "kronk.finish_reason": record.finish_reason,
        }
    )
    prepare = _child(
        tracer,
        http_span,
        "prepare-request",
        clock.ns(record.started_at),
        clock.ns(record.prompt_ready_at),
        {"kronk.model": record.model},
    )
    _child(
        tracer,
        prepare,
        "create-prompt",
        clock.ns(record.prompt_started_at),
        clock.ns(record.prompt_ready_at),
        {"kronk.prompt_tokens": usage.prompt_tokens, "kronk.dropped_tokens": usage.dropped_tokens},
    )
    run = record.generation
    queued_until = run.started_at if run is not None and run.started_at else record.finished_at
    _child(
        tracer,
        http_span,
        "queue-wait",
        clock.ns(record.prompt_ready_at),
        clock.ns(queued_until),
    )
    if run is not None and run.started_at:
        _engine_spans(tracer, http_span, run, record, clock)
    if record.tools:
        parse_from = run.first_token_at if run is not None and run.first_token_at else 0.0
        _child(
            tracer,
            http_span,
            "tool-call-parsing",
            clock.ns(parse_from or record.prompt_ready_at),
            clock.ns(record.finished_at),
            {
                "kronk.tools": record.tools,
                "kronk.tool_calls": record.tool_calls,
                "kronk.parse_seconds": record.parse_seconds,
            },
        )


def _engine_spans(
    tracer: Tracer, http_span: Span, run: RequestRecord, record: ChatRecord, clock: _Clock
) -> None:
    attributes: dict[str, str | int | float] = {
        "kronk.request_id": run.request_id,
        "kronk.slot": run.slot,
        "kronk.finish_reason": run.finish_reason,
        "queue-wait": run.started_at - run.enqueued_at,
    }
    if run.first_token_at:
        attributes["kronk.time_to_first_token_seconds"] = run.first_token_at - record.started_at
    process = _child(
        tracer,
        http_span,
        "process-request",
        clock.ns(run.started_at),
        clock.ns(run.finished_at),
        attributes,
    )
    cache_end = run.cache_ready_at or run.finished_at
    _child(
        tracer,
        process,
        "process-cache",
        clock.ns(run.started_at),
        clock.ns(cache_end),
        {"kronk.cached_tokens": run.cached_tokens, "kronk.prompt_tokens": run.prompt_tokens},
    )
    if not run.cache_ready_at:
        return
    _child(
        tracer,
        process,
        "prefill",
        clock.ns(run.cache_ready_at),
        clock.ns(run.prefilled_at or run.finished_at),
        {"kronk.prefill_tokens": run.prefill_tokens},
    )
    if not run.first_token_at:
        return
    _child(
        tracer,
        process,
        "first-token",
        clock.ns(run.prefilled_at or run.first_token_at),
        clock.ns(run.first_token_at),
    )
    _child(
        tracer,
        process,
        "token-generation",
        clock.ns(run.first_token_at),
        clock.ns(run.finished_at),
        {
            "kronk.completion_tokens": run.completion_tokens,
            "kronk.tokens_per_second": run.tokens_per_second,
        },
    )


def record_load(tracer: Tracer, http_span: Span, model_id: str, seconds: float) -> None:
    clock = _Clock()
    now = time.monotonic()
    _child(
        tracer,
        http_span,
        "model-file-load-time",
        clock.ns(now - seconds),
        clock.ns(now),
        {"kronk.model": model_id, "kronk.load_seconds": seconds},
    )
