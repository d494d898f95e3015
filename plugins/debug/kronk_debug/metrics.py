"""Prometheus metrics: request counters and latency histograms, engine and cache gauges.

prometheus-client, not OpenTelemetry's Prometheus exporter: see
docs/observability.md ("Why prometheus-client"). Every server has its own
registry, so two servers in one process never mix their numbers.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass, fields

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kronk_core import Kronk
from kronk_core.contract import CacheCounters, ChatRecord
from kronk_debug.manual import ManualFigures

# Seconds: from a fast scrape of a cached prompt to a long generation on a CPU.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# A healthy loop is late by well under a millisecond; a blocked one by the block.
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
TOKENS_PER_SECOND_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
REQUEST_LABELS = ("endpoint", "model")


@dataclass(slots=True)
class RequestLabels:
    """What one HTTP request is labelled with; the chat hook fills in the model."""

    metrics: Metrics
    endpoint: str
    model: str = ""
    failed: bool = False


# Set by the metrics middleware for the request being served.
current_labels: ContextVar[RequestLabels | None] = ContextVar("kronk_metric_labels", default=None)


class Metrics:
    """One server's metrics, in a registry of its own."""

    def __init__(self, kronk: Kronk) -> None:
        self.registry = CollectorRegistry()
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=self.registry)
        self.registry.register(EngineCollector(kronk))
        self.manual = ManualFigures()
        self.registry.register(self.manual)
        r = self.registry
        self.requests = Counter(
            "kronk_requests", "HTTP requests answered", (*REQUEST_LABELS, "code"), registry=r
        )
        self.errors = Counter(
            "kronk_errors",
            "Requests answered with an error status, or whose stream failed after it started",
            (*REQUEST_LABELS, "code"),
            registry=r,
        )
        self.request_seconds = self._histogram(
            "kronk_request_duration_seconds", "From the request's arrival to its last byte"
        )
        self.model_load_seconds = Histogram(
            "kronk_model_load_seconds",
            "How long loading a model took",
            ("model",),
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.prompt_creation_seconds = self._histogram(
            "kronk_prompt_creation_seconds", "Chat template rendering and tokenization"
        )
        self.queue_wait_seconds = self._histogram(
            "kronk_queue_wait_seconds", "From the prompt being queued to a slot taking it"
        )
        self.cache_seconds = self._histogram(
            "kronk_cache_seconds", "Cache lookup and restore in the slot (the cache strategy)"
        )
        self.prefill_seconds = self._histogram(
            "kronk_prefill_seconds", "Decoding the prompt tokens the cache did not hold"
        )
        self.ttft_seconds = self._histogram(
            "kronk_time_to_first_token_seconds", "From the request's arrival to its first token"
        )
        self.tokens_per_second = Histogram(
            "kronk_tokens_per_second",
            "Decode speed of one request: tokens after the first per second",
            REQUEST_LABELS,
            buckets=TOKENS_PER_SECOND_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = self._counter("kronk_prompt_tokens", "Prompt tokens")
        self.cached_tokens = self._counter(
            "kronk_cached_tokens", "Prompt tokens reused from the KV cache, not prefilled"
        )
        self.completion_tokens = self._counter("kronk_completion_tokens", "Generated tokens")
        self.reasoning_tokens = self._counter(
            "kronk_reasoning_tokens", "Generated tokens that were reasoning"
        )
        self.speculative_accepted = self._counter(
            "kronk_speculative_accepted_tokens", "Drafted tokens the model accepted"
        )
        self.speculative_rejected = self._counter(
            "kronk_speculative_rejected_tokens", "Drafted tokens the model rejected"
        )
        # A histogram, not the last figure: a stall between two scrapes still shows.
        self.event_loop_lag = Histogram(
            "kronk_event_loop_lag_seconds",
            "How late the API server's event loop ran a 0.5 s timer",
            buckets=LAG_BUCKETS,
            registry=r,
        )

    def _histogram(self, name: str, documentation: str) -> Histogram:
        return Histogram(
            name, documentation, REQUEST_LABELS, buckets=DURATION_BUCKETS, registry=self.registry
        )

    def _counter(self, name: str, documentation: str) -> Counter:
        return Counter(name, documentation, REQUEST_LABELS, registry=self.registry)

    def observe_request(self, labels: RequestLabels, status: int, seconds: float) -> None:
        code = str(status)
        self.requests.labels(labels.endpoint, labels.model, code).inc()
        error = status >= 400 or labels.failed
        self.manual.observe_request(error=error, status=status)
        if error:
            self.errors.labels(labels.endpoint, labels.model, code).inc()
        self.request_seconds.labels(labels.endpoint, labels.model).observe(seconds)

    def observe_load(self, model_id: str, seconds: float) -> None:
        self.model_load_seconds.labels(model_id).observe(seconds)
        self.manual.observe("model_load", seconds)

    def observe_chat(self, record: ChatRecord, endpoint: str) -> None:
        self.manual.observe_chat(record)
        key = (endpoint, record.model)
        self.prompt_creation_seconds.labels(*key).observe(
            record.prompt_ready_at - record.prompt_started_at
        )
        usage = record.usage
        self.prompt_tokens.labels(*key).inc(usage.prompt_tokens)
        self.cached_tokens.labels(*key).inc(usage.cached_tokens)
        self.completion_tokens.labels(*key).inc(usage.completion_tokens)
        self.reasoning_tokens.labels(*key).inc(usage.reasoning_tokens)
        # Series only where something drafted: no speculation, no speculative series.
        if usage.accepted_prediction_tokens or usage.rejected_prediction_tokens:
            self.speculative_accepted.labels(*key).inc(usage.accepted_prediction_tokens)
            self.speculative_rejected.labels(*key).inc(usage.rejected_prediction_tokens)
        run = record.generation
        if run is None or not run.started_at:
            return
        self.queue_wait_seconds.labels(*key).observe(run.started_at - run.enqueued_at)
        if run.cache_ready_at:
            self.cache_seconds.labels(*key).observe(run.cache_ready_at - run.started_at)
        if run.prefilled_at:
            self.prefill_seconds.labels(*key).observe(run.prefilled_at - run.cache_ready_at)
        if run.first_token_at:
            self.ttft_seconds.labels(*key).observe(run.first_token_at - record.started_at)
        if run.tokens_per_second:
            self.tokens_per_second.labels(*key).observe(run.tokens_per_second)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


# Engine and cache figures, read from every loaded chat model at scrape time.
_ENGINE_GAUGES = {
    "kronk_slots": "Slots (parallel sequences) of the model",
    "kronk_slots_active": "Slots running a request",
    "kronk_queue_length": "Requests waiting for a slot",
    "kronk_kv_cells_used": "Tokens held in the model's KV sequences, summed over slots",
    "kronk_cache_host_bytes": "Bytes of KV state the cache keeps in host memory",
}
_ENGINE_COUNTERS = {
    "kronk_engine_steps": "Engine steps (one batched decode each) since the model loaded",
    "kronk_engine_prefilled_tokens": "Prompt tokens decoded since the model loaded",
    "kronk_engine_generated_tokens": "Tokens generated since the model loaded",
}
# CacheCounters fields, as counters since the model loaded (a field added later is
# exported too, with its name as its help).
_CACHE_HELP = {
    "hits": "Requests whose whole cached conversation or system prompt was reused",
    "partial_hits": "Requests that reused part of a slot's conversation",
    "rebuilds": "Requests whose slot had to be rebuilt from scratch",
    "evictions": "Conversations evicted from a slot for another",
    "restores": "Conversations restored from the host-memory tier",
    "checkpoint_restores": "Cuts below the trim floor made through a checkpoint",
    "shared_prefixes": "Prompt prefixes copied from another slot",
    "tokens_saved": "Prompt tokens the cache saved from prefilling",
}
_CACHE_COUNTERS = {
    field.name: _CACHE_HELP.get(field.name, field.name)
    for field in fields(CacheCounters)
    if field.name != "host_bytes"
}


class EngineCollector(Collector):
    """Reads each loaded chat model's engine and cache when Prometheus scrapes."""

    def __init__(self, kronk: Kronk) -> None:
        self._kronk = kronk

    def describe(self) -> Iterable[Metric]:
        return list(self._families().values())

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        for loaded in self._kronk.loaded_models():
            engine = loaded.engine
            stats = engine.stats()
            counters = engine.cache_counters()
            values: dict[str, float] = {
                "kronk_slots": len(engine.slots),
                "kronk_slots_active": stats.active,
                "kronk_queue_length": stats.queued,
                "kronk_kv_cells_used": sum(state.cached_tokens for state in engine.slot_states()),
                "kronk_cache_host_bytes": counters.host_bytes,
                "kronk_engine_steps": stats.steps,
                "kronk_engine_prefilled_tokens": stats.prefilled_tokens,
                "kronk_engine_generated_tokens": stats.generated_tokens,
            }
            for name in _CACHE_COUNTERS:
                values[f"kronk_cache_{name}"] = getattr(counters, name)
            for name, family in families.items():
                family.add_metric([loaded.id], values[name])
        return families.values()

    def _families(self) -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            name: GaugeMetricFamily(name, text, labels=["model"])
            for name, text in _ENGINE_GAUGES.items()
        }
        counters = {
            **_ENGINE_COUNTERS,
            **{f"kronk_cache_{name}": text for name, text in _CACHE_COUNTERS.items()},
        }
        for name, text in counters.items():
            families[name] = CounterMetricFamily(name, text, labels=["model"])
        return families
