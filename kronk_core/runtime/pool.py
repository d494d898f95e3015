"""The model pool: which models stay loaded, loading each once, unloading the idle ones.

At most `capacity` models are loaded. A request leases its model for as long
as it needs the model to stay put (a chat holds it until its request is in
the engine; from then on the engine's own work keeps the model busy). When a
new model needs a place, the least recently used model that is neither leased
nor busy is unloaded; if every loaded model is busy, the request waits up to
its `wait` for one to become free, then gets PoolBusyError (503). A model idle
for longer than `ttl` seconds unloads in the background (`ttl` 0: never); a request
may set one model's own TTL (`keep_alive`).
Concurrent first requests for a model share one load; a load that fails
leaves nothing behind and every waiting request gets its error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic, Protocol, TypeVar

from kronk_core.contract.errors import PoolBusyError

log = logging.getLogger(__name__)

_POLL_SECONDS = 0.05  # how often a waiting request re-checks whether a busy model finished
# How many models' failed loads are remembered (for `state`). Bounded: requests may name
# any number of models that do not exist.
_REMEMBERED_FAILURES = 16


class Poolable(Protocol):
    """What the pool needs of a loaded model."""

    @property
    def busy(self) -> bool:
        """True while the model has requests queued or running."""

    def close(self) -> None: ...


M = TypeVar("M", bound=Poolable)


class LoadState(StrEnum):
    """Where a model stands in the pool (what `/v1/readiness` reports)."""

    not_loaded = "not_loaded"
    loading = "loading"
    loaded = "loaded"
    failed = "failed"  # its last load failed; the next request for it tries again


@dataclass(eq=False)
class _Entry(Generic[M]):
    model_id: str
    model: M | None = None  # None while loading
    error: BaseException | None = None
    leases: int = 0
    last_used: float = field(default_factory=time.monotonic)
    loaded_at: float = 0.0
    load_seconds: float = 0.0
    keep: bool = False  # exempt from TTL expiry (the server's preloaded default model)
    # This model's own TTL, set by a request (Ollama's keep_alive); None: the pool's.
    ttl: float | None = None

    def idle(self) -> bool:
        return self.model is not None and self.leases == 0 and not self.model.busy


@dataclass(frozen=True, slots=True)
class PoolEntry(Generic[M]):
    """A loaded model as `kronk model ps` shows it."""

    model_id: str
    model: M
    leases: int
    idle_seconds: float
    loaded_seconds: float
    # How long its load took.
    load_seconds: float
    # Seconds until TTL expiry if it stays idle; None when it never expires.
    ttl_left: float | None


class Lease(Generic[M]):
    """A model held in the pool until release(); use as a context manager."""

    def __init__(self, pool: ModelPool[M], entry: _Entry[M]) -> None:
        assert entry.model is not None
        self.model: M = entry.model
        self._pool = pool
        self._entry: _Entry[M] | None = entry

    def release(self) -> None:
        if self._entry is not None:
            self._pool._release(self._entry)
            self._entry = None

    def __enter__(self) -> M:
        return self.model

    def __exit__(self, *_: object) -> None:
        self.release()


class ModelPool(Generic[M]):
    """Thread-safe; `load` runs on the requesting thread, outside the pool's lock."""

    def __init__(self, load: Callable[[str], M], *, capacity: int, ttl: float) -> None:
        self._load = load
        self.capacity = capacity
        self.ttl = ttl
        self._entries: dict[str, _Entry[M]] = {}
        self._failures: dict[str, BaseException] = {}  # the last failed loads, oldest first
        self._cond = threading.Condition()
        self._closed = False
        self._sweeper: threading.Thread | None = None
        if ttl > 0:
            self._start_sweeper()

    def _start_sweeper(self) -> None:
        self._sweeper = threading.Thread(target=self._sweep, name="kronk-pool-ttl", daemon=True)
        self._sweeper.start()

    # ---- leases ------------------------------------------------------------

    def try_lease(self, model_id: str) -> Lease[M] | None:
        """A lease on an already loaded model, or None (never blocks on a load)."""
        with self._cond:
            entry = self._entries.get(model_id)
            if entry is None or entry.model is None:
                return None
            return self._lease(entry)

    def lease(self, model_id: str, *, wait: float, keep: bool = False) -> Lease[M]:
        """Lease the model, loading it first if needed (blocks; see the module docstring)."""
        deadline = time.monotonic() + wait
        victim: _Entry[M] | None = None
        with self._cond:
            while True:
                if self._closed:
                    raise PoolBusyError("the model pool is shut down")
                entry = self._entries.get(model_id)
                if entry is not None and entry.model is not None:
                    entry.keep = entry.keep or keep
                    return self._lease(entry)
                if entry is not None:  # another request is loading it: share its outcome
                    self._cond.wait()
                    if entry.error is not None:
                        raise entry.error
                    continue
                if len(self._entries) >= self.capacity:
                    victim = self._least_recently_used()
                    if victim is not None:
                        del self._entries[victim.model_id]
                if len(self._entries) < self.capacity:
                    entry = self._entries[model_id] = _Entry(model_id, keep=keep)
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PoolBusyError(
                        f"cannot load {model_id}: all {self.capacity} places of the model pool "
                        "(models_in_cache) hold models with active requests; retry later",
                        retry_after=max(1, int(wait) or 1),
                    )
                self._cond.wait(min(remaining, _POLL_SECONDS))
        if victim is not None:
            self._close(victim, "to make room for " + model_id)
        return self._fill(entry)

    def _fill(self, entry: _Entry[M]) -> Lease[M]:
        started = time.monotonic()
        try:
            model = self._load(entry.model_id)
        except BaseException as exc:
            with self._cond:
                entry.error = exc
                del self._entries[entry.model_id]
                self._remember_failure(entry.model_id, exc)
                self._cond.notify_all()
            raise
        with self._cond:
            self._failures.pop(entry.model_id, None)
            entry.model = model
            entry.loaded_at = time.monotonic()
            entry.load_seconds = entry.loaded_at - started
            lease = self._lease(entry)
            self._cond.notify_all()
        return lease

    def _remember_failure(self, model_id: str, error: BaseException) -> None:
        self._failures.pop(model_id, None)
        self._failures[model_id] = error
        if len(self._failures) > _REMEMBERED_FAILURES:
            del self._failures[next(iter(self._failures))]

    def _lease(self, entry: _Entry[M]) -> Lease[M]:
        entry.leases += 1
        entry.last_used = time.monotonic()
        return Lease(self, entry)

    def _release(self, entry: _Entry[M]) -> None:
        with self._cond:
            entry.leases -= 1
            entry.last_used = time.monotonic()
            self._cond.notify_all()

    def _least_recently_used(self) -> _Entry[M] | None:
        idle = [entry for entry in self._entries.values() if entry.idle()]
        return min(idle, key=lambda entry: entry.last_used, default=None)

    # ---- inspection and unloading ---------------------------------------------

    def get(self, model_id: str) -> M | None:
        """The loaded model, without leasing it (for reports; it may unload at any time)."""
        entry = self._entries.get(model_id)
        return None if entry is None else entry.model

    def state(self, model_id: str) -> tuple[LoadState, BaseException | None]:
        """The model's load state, and for `failed` the error its last load raised.

        Only the last 16 models whose load failed are remembered as `failed`.
        """
        with self._cond:
            entry = self._entries.get(model_id)
            if entry is not None:
                return (LoadState.loading if entry.model is None else LoadState.loaded), None
            failure = self._failures.get(model_id)
            return (LoadState.not_loaded if failure is None else LoadState.failed), failure

    @property
    def closed(self) -> bool:
        return self._closed

    def models(self) -> list[M]:
        return [entry.model for entry in list(self._entries.values()) if entry.model is not None]

    def entries(self) -> list[PoolEntry[M]]:
        now = time.monotonic()
        with self._cond:
            snapshot = [entry for entry in self._entries.values() if entry.model is not None]
            return [self._describe(entry, now) for entry in snapshot]

    def _describe(self, entry: _Entry[M], now: float) -> PoolEntry[M]:
        assert entry.model is not None
        idle = 0.0 if not entry.idle() else now - entry.last_used
        ttl = self._ttl(entry)
        return PoolEntry(
            model_id=entry.model_id,
            model=entry.model,
            leases=entry.leases,
            idle_seconds=idle,
            loaded_seconds=now - entry.loaded_at,
            load_seconds=entry.load_seconds,
            ttl_left=None if ttl is None else max(0.0, ttl - idle),
        )

    def _ttl(self, entry: _Entry[M]) -> float | None:
        """Seconds the entry may stay idle before it unloads; None: it never expires."""
        if entry.keep:
            return None
        if entry.ttl is not None:
            return entry.ttl
        return self.ttl if self.ttl > 0 else None

    def keep_alive(self, model_id: str, seconds: float | None) -> None:
        """How long the loaded model stays once idle, counted from its last request:
        `seconds` (0: unload as soon as it is idle), None: until the pool needs its place.
        It overrides cache_ttl (and the preloaded model's exemption) for this model, until
        it unloads; a model that is not loaded is left alone."""
        with self._cond:
            entry = self._entries.get(model_id)
            if entry is None or entry.model is None:
                return
            entry.keep = seconds is None
            entry.ttl = seconds
            if seconds is not None and self._sweeper is None and not self._closed:
                self._start_sweeper()
            self._cond.notify_all()

    def unload(self, model_id: str) -> bool:
        """Unload now, busy or not (an operator's decision); False if it was not loaded."""
        with self._cond:
            entry = self._entries.get(model_id)
            if entry is None or entry.model is None:
                return False
            del self._entries[model_id]
            self._cond.notify_all()
        self._close(entry, "on request")
        return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            entries = [entry for entry in self._entries.values() if entry.model is not None]
            self._entries.clear()
            self._cond.notify_all()
        for entry in entries:
            self._close(entry, "at shutdown")
        if self._sweeper is not None:
            self._sweeper.join()

    def _close(self, entry: _Entry[M], why: str) -> None:
        assert entry.model is not None
        entry.model.close()
        log.info("unloaded %s %s", entry.model_id, why)

    def _sweep(self) -> None:
        """Background thread: unload models idle past their TTL."""
        while True:
            with self._cond:
                if self._closed:
                    return
                self._cond.wait(self._sweep_interval())
                now = time.monotonic()
                expired = []
                for entry in list(self._entries.values()):
                    ttl = self._ttl(entry)
                    if entry.model is None or ttl is None:
                        continue
                    if not entry.idle():
                        entry.last_used = now  # the TTL counts from the end of the last request
                    elif now - entry.last_used > ttl:
                        expired.append((self._entries.pop(entry.model_id), ttl))
                if expired:
                    self._cond.notify_all()
            for entry, ttl in expired:
                why = "cache_ttl" if entry.ttl is None else "keep_alive"
                self._close(entry, f"after {ttl:g}s idle ({why})")

    def _sweep_interval(self) -> float:
        """A quarter of the shortest TTL, within 0.05 to 30 seconds (called under the lock)."""
        ttls = [ttl for entry in self._entries.values() if (ttl := self._ttl(entry)) is not None]
        if self.ttl > 0:
            ttls.append(self.ttl)  # a model that loads while the sweeper waits
        return min(max(min(ttls) / 4, 0.05), 30.0) if ttls else 30.0
