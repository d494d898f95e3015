"""The debug plugin's parts that need no server: hosts, profiles, lag probes, metrics."""

from __future__ import annotations

import asyncio
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from kronk_core import Kronk, KronkConfig
from kronk_core.contract.records import ChatRecord
from kronk_core.contract.types import Usage
from kronk_debug.metrics import Metrics
from kronk_debug.profiling import (
    Exclusive,
    ProfileBusyError,
    allocation_top,
    cpu_profile,
    probe_loop_lag,
)
from kronk_debug.server import is_loopback
from kronk_debug.settings import DebugSettings


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.0.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.0.0.5", False),
        ("kronk.internal", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_host_must_be_host_and_port() -> None:
    with pytest.raises(ValidationError, match="HOST:PORT"):
        DebugSettings(host="localhost")


def test_one_profile_of_a_kind_at_a_time() -> None:
    exclusive = Exclusive("CPU")
    with pytest.raises(ProfileBusyError, match="already running") as caught:
        exclusive.run(lambda: exclusive.run(lambda: "inner"))
    assert caught.value.status == 409
    assert exclusive.run(lambda: "free again") == "free again"


def test_cpu_profile_is_folded_stacks_of_other_threads() -> None:
    stop = threading.Event()

    def spin_here() -> None:
        while not stop.is_set():
            sum(range(1000))

    worker = threading.Thread(target=spin_here, name="spinner")
    worker.start()
    try:
        folded = cpu_profile(0.2, 0.005)
    finally:
        stop.set()
        worker.join()
    lines = folded.splitlines()
    counts = [int(line.rpartition(" ")[2]) for line in lines]
    assert counts == sorted(counts, reverse=True)
    spinner = [line for line in lines if line.startswith("spinner;")]
    assert spinner and all("spin_here" in line for line in spinner)
    assert not any(line.startswith("MainThread;") for line in lines)  # the sampler's own thread


def test_allocation_top_finds_what_was_allocated_in_the_window() -> None:
    kept: list[bytes] = []

    def allocate_once_tracing() -> None:
        while not tracemalloc.is_tracing():
            time.sleep(0.001)
        kept.append(bytes(4 << 20))

    allocator = threading.Thread(target=allocate_once_tracing)
    allocator.start()
    report = allocation_top(1.0, 3)
    allocator.join()
    first = report.split("\n\n")[1]
    assert first.startswith("409") and " KiB in " in first  # the 4 MiB block, on top
    assert "kept.append(bytes(4 << 20))" in first
    assert not tracemalloc.is_tracing()  # it traced for the window only


def test_loop_lag_probes_a_running_loop() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        lag = probe_loop_lag(loop, 0.5, 0.01)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    # The first probe had the whole window to come back from a loop that runs nothing else.
    assert lag.samples >= 1 and 0 <= lag.mean_seconds <= lag.max_seconds


def test_a_stuck_loop_leaves_probes_pending() -> None:
    loop = asyncio.new_event_loop()  # never run: every probe stays pending
    try:
        lag = probe_loop_lag(loop, 0.3, 0.01)
    finally:
        loop.close()
    assert lag.samples == 0 and lag.pending >= 3


def speculated(model: str, accepted: int, rejected: int) -> ChatRecord:
    """A finished chat whose usage says what a drafting decoding strategy did."""
    usage = Usage(
        prompt_tokens=10,
        completion_tokens=accepted + 2,
        accepted_prediction_tokens=accepted,
        rejected_prediction_tokens=rejected,
    )
    return ChatRecord("r-1", model, 1.0, 1.1, 1.2, 2.0, "stop", usage)


def test_speculative_tokens_are_counted_where_something_drafted(tmp_path: Path) -> None:
    """Without a speculative plugin there is nothing to show; with one, its usage counts
    feed the two counters (the acceptance ratio is PromQL over them)."""
    metrics = Metrics(Kronk(KronkConfig(base_path=tmp_path)))
    metrics.observe_chat(speculated("drafting", accepted=7, rejected=3), "chat-completions")
    metrics.observe_chat(speculated("drafting", accepted=5, rejected=1), "chat-completions")
    metrics.observe_chat(speculated("plain", accepted=0, rejected=0), "chat-completions")
    samples = {
        (sample.name, sample.labels.get("model")): sample.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for sample in family.samples
    }
    assert samples[("kronk_speculative_accepted_tokens_total", "drafting")] == 12
    assert samples[("kronk_speculative_rejected_tokens_total", "drafting")] == 4
    assert samples[("kronk_completion_tokens_total", "plain")] == 2
    assert not {name for name, model in samples if model == "plain" and "speculative" in name}
