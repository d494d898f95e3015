"""Waiting on engine state in tests: conditions, never the machine's speed."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kronk_core.engine import Engine


async def wait_until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


async def wait_idle(engine: Engine) -> None:
    """Wait until no request is running or queued and every slot is free."""
    await wait_until(
        lambda: (
            engine.stats().active == 0
            and engine.stats().queued == 0
            and not any(slot.busy for slot in engine.slots)
        )
    )
