"""Python counterparts of Go's pprof: thread stacks, a sampling CPU profile, allocation
sites (tracemalloc) and event-loop lag. Each runs on demand and costs nothing otherwise.
"""

from __future__ import annotations

import asyncio
import collections
import os
import resource
import statistics
import sys
import threading
import time
import traceback
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from kronk_core.contract import KronkError


class ProfileBusyError(KronkError):
    status = 409
    code = "profile_running"


class Exclusive:
    """One profile of a kind at a time: a second one gets 409 instead of skewing the first."""

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._lock = threading.Lock()

    def run(self, work: Callable[[], str]) -> str:
        if not self._lock.acquire(blocking=False):
            raise ProfileBusyError(f"a {self._kind} profile is already running; retry when it ends")
        try:
            return work()
        finally:
            self._lock.release()


def _thread_names() -> dict[int, str]:
    return {thread.ident: thread.name for thread in threading.enumerate() if thread.ident}


def thread_stacks() -> str:
    """Every thread's current stack, innermost call last (like goroutine?debug=2)."""
    names = _thread_names()
    blocks = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        blocks.append(f"thread {names.get(ident, '?')} (id {ident}):\n{stack}")
    return "\n".join(blocks)


def _folded(frame: FrameType | None) -> list[str]:
    calls = []
    while frame is not None:
        code = frame.f_code
        calls.append(f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})")
        frame = frame.f_back
    calls.reverse()
    return calls


def cpu_profile(seconds: float, interval: float) -> str:
    """Sample every thread's stack each `interval` for `seconds` (wall clock).

    The answer is in the folded format that flamegraph.pl, inferno and
    speedscope read: `thread;outer;...;inner count`, most frequent first. A
    thread inside a C call that released the GIL (llama_decode) is sampled
    at the Python line that called it.
    """
    me = threading.get_ident()
    counts: collections.Counter[str] = collections.Counter()
    deadline = time.monotonic() + seconds
    while True:
        names = _thread_names()
        for ident, frame in sys._current_frames().items():
            if ident != me:
                stack = ";".join([names.get(ident, "?"), *_folded(frame)]).replace(" ", "_")
                counts[stack] += 1
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    return "".join(f"{stack} {count}\n" for stack, count in counts.most_common())


def allocation_top(seconds: float, limit: int) -> str:
    """The allocation sites holding the most memory among those allocated in the next `seconds`.

    tracemalloc runs only for the window (unless something else started it),
    so its overhead is paid only while asked for.
    """
    started_here = not tracemalloc.is_tracing()
    if started_here:
        tracemalloc.start(16)
    try:
        time.sleep(seconds)
        snapshot = tracemalloc.take_snapshot()
    finally:
        if started_here:
            tracemalloc.stop()
    snapshot = snapshot.filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    stats = snapshot.statistics("traceback")
    total = sum(stat.size for stat in stats)
    lines = [
        f"{len(stats)} allocation sites hold {total / 1024:.1f} KiB allocated in the last "
        f"{seconds:g}s; the top {min(limit, len(stats))}:",
    ]
    for stat in stats[:limit]:
        lines.append(f"\n{stat.size / 1024:.1f} KiB in {stat.count} blocks")
        lines.extend(f"  {line}" for line in stat.traceback.format(most_recent_first=True))
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class LoopLag:
    samples: int
    mean_seconds: float
    max_seconds: float
    # Probes the loop had not run when the window closed (a loop that is stuck).
    pending: int


def probe_loop_lag(loop: asyncio.AbstractEventLoop, seconds: float, interval: float) -> LoopLag:
    """From another thread: how late `loop` runs callbacks scheduled every `interval`."""
    lags: list[float] = []
    sent = 0
    done = threading.Event()

    def arrived(at: float) -> None:
        lags.append(time.perf_counter() - at)

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sent += 1
        loop.call_soon_threadsafe(arrived, time.perf_counter())
        time.sleep(interval)
    # The loop runs callbacks in order: once this one ran, every probe has. The last
    # probes get one more interval (or a second at most) to come back.
    loop.call_soon_threadsafe(done.set)
    done.wait(min(1.0, max(interval, 0.1)))
    seen = list(lags)
    return LoopLag(
        samples=len(seen),
        mean_seconds=statistics.fmean(seen) if seen else 0.0,
        max_seconds=max(seen, default=0.0),
        pending=sent - len(seen),
    )


class LagMonitor:
    """On the API loop: how late a 0.5 s timer fires, reported to `record` each time."""

    INTERVAL = 0.5

    def __init__(self, record: Callable[[float], None]) -> None:
        self._record = record
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _watch(self) -> None:
        while True:
            began = time.perf_counter()
            await asyncio.sleep(self.INTERVAL)
            self._record(max(0.0, time.perf_counter() - began - self.INTERVAL))


@dataclass(frozen=True, slots=True)
class ProcessFigures:
    """What the debug page charts, every couple of seconds."""

    wall_seconds: float
    cpu_seconds: float  # user and system, all threads
    rss_bytes: int  # resident memory now (its peak where there is no /proc)
    threads: int
    loop_lag_max_seconds: float


def resident_bytes() -> int:
    statm = Path("/proc/self/statm")
    if statm.is_file():
        return int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS counts bytes, Linux KiB


def process_figures(loop: asyncio.AbstractEventLoop) -> ProcessFigures:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    lag = probe_loop_lag(loop, 0.1, 0.02)
    return ProcessFigures(
        wall_seconds=time.monotonic(),
        cpu_seconds=usage.ru_utime + usage.ru_stime,
        rss_bytes=resident_bytes(),
        threads=threading.active_count(),
        loop_lag_max_seconds=lag.max_seconds,
    )
