"""The Kronk manual's metric names (§14.4), so that its PromQL works as printed:
`model_ttft_avg`, `usage_tokens_per_second_avg`, `rate(requests[5m])`,
`rate(errors[5m]) / rate(requests[5m])`.

Each figure is the average, least and most of every value since the server started, without
labels, as the manual's are; the `kronk_*` histograms hold the same values by endpoint and
model. `requests`, `errors` and `panics` count up from zero (gauges by type, so that they keep
the manual's names: a counter's would end in `_total`; `rate()` reads them all the same).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kronk_core.contract import ChatRecord

# Figure → its help; each is exported as `<name>_avg`, `<name>_min` and `<name>_max`.
FIGURES = {
    "model_load": "Seconds loading a model took",
    "model_prompt_creation": "Seconds rendering and tokenizing a chat prompt",
    "model_prefill": "Seconds decoding the prompt tokens the cache did not hold",
    "model_ttft": "Seconds from a request's arrival to its first token",
    "usage_prompt_tokens": "Prompt tokens of a request",
    "usage_reasoning_tokens": "Generated tokens of a request that were reasoning",
    "usage_completion_tokens": "Generated tokens of a request",
    "usage_output_tokens": "Generated tokens of a request that were not reasoning",
    "usage_total_tokens": "Prompt and generated tokens of a request",
    "usage_tokens_per_second": "A request's decode speed: tokens after the first per second",
}


@dataclass(slots=True)
class Figure:
    count: int = 0
    total: float = 0.0
    least: float = math.inf
    most: float = -math.inf

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.least = min(self.least, value)
        self.most = max(self.most, value)


class ManualFigures(Collector):
    """Figures under the manual's names; fed by Metrics, read at each scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._figures = {name: Figure() for name in FIGURES}
        self._requests = 0
        self._errors = 0
        self._panics = 0

    def observe(self, name: str, value: float) -> None:
        with self._lock:
            self._figures[name].add(value)

    def observe_request(self, *, error: bool, status: int) -> None:
        with self._lock:
            self._requests += 1
            self._errors += error
            # A 500 is an error nothing expected: the manual's panic.
            self._panics += status == 500

    def observe_chat(self, record: ChatRecord) -> None:
        usage = record.usage
        self.observe("model_prompt_creation", record.prompt_ready_at - record.prompt_started_at)
        self.observe("usage_prompt_tokens", usage.prompt_tokens)
        self.observe("usage_reasoning_tokens", usage.reasoning_tokens)
        self.observe("usage_completion_tokens", usage.completion_tokens)
        self.observe("usage_output_tokens", usage.completion_tokens - usage.reasoning_tokens)
        self.observe("usage_total_tokens", usage.prompt_tokens + usage.completion_tokens)
        run = record.generation
        if run is None or not run.started_at:
            return
        if run.prefilled_at and run.cache_ready_at:
            self.observe("model_prefill", run.prefilled_at - run.cache_ready_at)
        if run.first_token_at:
            self.observe("model_ttft", run.first_token_at - record.started_at)
        if run.tokens_per_second:
            self.observe("usage_tokens_per_second", run.tokens_per_second)

    def describe(self) -> Iterable[Metric]:
        return []  # read at each scrape; a figure without values is not exported

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            counts = (
                ("requests", "HTTP requests answered", self._requests),
                ("errors", "Requests answered with an error, or whose stream failed", self._errors),
                ("panics", "Requests answered 500: an error nothing expected", self._panics),
            )
            figures = {name: replace(figure) for name, figure in self._figures.items()}
        for name, help_text, value in counts:
            yield GaugeMetricFamily(name, help_text, value=value)
        # Python has threads where Go has goroutines.
        yield GaugeMetricFamily(
            "goroutines", "Threads of the server process", value=threading.active_count()
        )
        for name, figure in figures.items():
            if not figure.count:
                continue
            help_text = FIGURES[name]
            yield GaugeMetricFamily(
                f"{name}_avg", f"{help_text}: average", value=figure.total / figure.count
            )
            yield GaugeMetricFamily(f"{name}_min", f"{help_text}: least", value=figure.least)
            yield GaugeMetricFamily(f"{name}_max", f"{help_text}: most", value=figure.most)
