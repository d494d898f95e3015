"""Waiting on engine state in tests: conditions, never the machine's speed.

`wait_until` and `reached` poll a condition; `wait_idle` waits for an engine to have no
request left; `all_steps_reported` for a step listener to have every step the engine ran;
`gated` holds an engine after a chosen decode step, so a test sees requests running or
queued for as long as it needs. Imports nothing of Kronk at run time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kronk_core.contract import Engine, EngineStats, StepRecord


async def wait_until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    """Return once `condition()` is true (polled every 5 ms in the event loop); fail the
    test with AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


async def all_steps_reported(engine: Engine, records: Sequence[StepRecord]) -> None:
    """Wait until `records` (a step listener's) ends with the engine's latest step: the
    engine reports a step after handing out the answers it finished, so a request's last
    step may not be in yet when its answer is."""
    await wait_until(lambda: bool(records) and records[-1].index >= engine.stats().steps)


def reached(condition: Callable[[], bool], seconds: float) -> bool:
    """Whether `condition` holds within `seconds` (polled; for tests outside an event loop)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


async def wait_idle(engine: Engine, timeout: float = 10.0) -> None:
    """Wait until no request is running or queued and every slot is free."""
    await wait_until(
        lambda: (
            engine.stats().active == 0
            and engine.stats().queued == 0
            and not any(slot.busy for slot in engine.slots)
        ),
        timeout,
    )


class EngineGate:
    """Holds an engine after the first decode step that `when` accepts, until `release()`:
    requests are then running or queued, for as long as the test needs, whatever the
    machine's speed. `stats` is the engine's at the moment it was held."""

    def __init__(self, engine: Engine, when: Callable[[StepRecord], bool]) -> None:
        self.held = threading.Event()
        self.stats: EngineStats | None = None
        self._engine = engine
        self._when = when
        self._open = threading.Event()

    def __call__(self, record: StepRecord) -> None:  # a step listener, on the engine thread
        if self.held.is_set() or not self._when(record):
            return
        self.stats = self._engine.stats()
        self.held.set()
        self._open.wait()

    async def wait_held(self, timeout: float = 60) -> EngineStats:
        assert await asyncio.to_thread(self.held.wait, timeout), "the engine was never held"
        assert self.stats is not None
        return self.stats

    def release(self) -> None:
        self._open.set()


@contextmanager
def gated(
    engine: Engine, when: Callable[[StepRecord], bool] = lambda _: True
) -> Iterator[EngineGate]:
    """`with gated(engine, when) as gate:` an EngineGate listening to `engine`'s steps,
    released and removed when the block ends, whatever the test did."""
    gate = EngineGate(engine, when)
    engine.add_step_listener(gate)
    try:
        yield gate
    finally:
        gate.release()  # never leave the engine blocked, whatever the test did
        engine.remove_step_listener(gate)


def cancelling(engine: Engine) -> int:
    """Running requests whose cancellation the engine has not reaped yet (test-only read)."""
    return sum(1 for job in list(engine._active) if job.cancelled)
