"""What a balancer needs to know: the server's load, and whether it is draining.

A stopping server first drains: readiness answers 503 so the balancer sends new
conversations elsewhere, the requests already running finish (up to the shutdown
timeout), and only then does uvicorn stop listening and exit.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send

from kronk_core import Kronk

# Health probes neither keep a draining server up nor count as its load.
UNCOUNTED = frozenset({"/v1/liveness", "/v1/readiness", "/health", "/v1/health"})


@dataclass
class Drain:
    """Requests in flight, and whether the server is draining (shared with the CLI's
    signal handler, which runs on another thread than the requests)."""

    draining: bool = False
    in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start(self) -> None:
        self.draining = True

    def wait_idle(self, timeout: float) -> bool:
        """Block until no request is in flight or `timeout` seconds passed; True if idle."""
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.in_flight

    def middleware(self, app: ASGIApp) -> ASGIApp:
        async def counted(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != ScopeType.HTTP or scope["path"] in UNCOUNTED:
                await app(scope, receive, send)
                return
            with self._lock:
                self.in_flight += 1
            try:
                await app(scope, receive, send)
            finally:
                with self._lock:
                    self.in_flight -= 1

        return counted


@dataclass(frozen=True)
class Load:
    """Slots and queues over every loaded text model."""

    slots_busy: int = 0
    slots_total: int = 0
    queued: int = 0
    queue_capacity: int = 0
    # Every loaded model has all its slots busy and its queue full: a new request waits
    # for queue room and then gets a 429.
    saturated: bool = False

    def header(self) -> str:
        """The X-Kronk-Load header: `slots_busy=1; slots_total=4; queued=0`."""
        return f"slots_busy={self.slots_busy}; slots_total={self.slots_total}; queued={self.queued}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_of(kronk: Kronk) -> Load:
    busy = total = queued = capacity = 0
    full = []
    for loaded in kronk.loaded_models():
        engine = loaded.engine
        states = engine.slot_states()
        model_busy = sum(1 for state in states if state.busy)
        stats = engine.stats()
        busy, total = busy + model_busy, total + len(states)
        queued, capacity = queued + stats.queued, capacity + engine.queue_capacity
        full.append(model_busy == len(states) and stats.queued >= engine.queue_capacity)
    return Load(busy, total, queued, capacity, saturated=bool(full) and all(full))
