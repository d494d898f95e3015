"""A pull: the files of one model fetched in turn, with progress anyone can watch.

The command line renders a pull's progress as bars; the server keeps its pulls
by id and streams their progress as server-sent events (the browser UI's
downloads page).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kronk_catalog.download import Downloader, FileSpec, PullError
from kronk_core.contract import KronkError, NotFoundError

log = logging.getLogger(__name__)

# Speed is measured over this many recent seconds.
SPEED_WINDOW_SECONDS = 5.0
# At most this many progress events a second per watcher.
EVENTS_PER_SECOND = 10


@dataclass(eq=False)
class Pull:
    """One model's files being fetched; `snapshot()` is what watchers see."""

    model: str
    files: Sequence[FileSpec]
    kind: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    status: str = "running"
    error: KronkError | None = None
    started: float = field(default_factory=time.time)
    positions: dict[Path, int] = field(default_factory=dict)
    sizes: dict[Path, int | None] = field(default_factory=dict)
    version: int = 0
    _samples: deque[tuple[float, int]] = field(default_factory=deque)
    _next: asyncio.Future[None] | None = None

    def __post_init__(self) -> None:
        self.sizes = {spec.dest: spec.size for spec in self.files}

    @property
    def done_bytes(self) -> int:
        return sum(self.positions.values())

    @property
    def total_bytes(self) -> int | None:
        sizes = list(self.sizes.values())
        return None if None in sizes else sum(size or 0 for size in sizes)

    def listener(self, spec: FileSpec) -> Any:
        def moved(position: int, size: int | None) -> None:
            self.positions[spec.dest] = position
            if size is not None:
                self.sizes[spec.dest] = size
            now = time.monotonic()
            self._samples.append((now, self.done_bytes))
            while self._samples and now - self._samples[0][0] > SPEED_WINDOW_SECONDS:
                self._samples.popleft()
            self.touch()

        return moved

    def touch(self) -> None:
        self.version += 1
        if self._next is not None and not self._next.done():
            self._next.set_result(None)
        self._next = None

    async def changed(self, seen: int) -> None:
        """Return once the pull has moved on from version `seen`."""
        while self.version == seen:
            if self._next is None:
                self._next = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._next)

    @property
    def finished(self) -> bool:
        return self.status != "running"

    def speed(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (first, start), (last, end) = self._samples[0], self._samples[-1]
        return (end - start) / (last - first) if last > first else 0.0

    def snapshot(self) -> dict[str, Any]:
        total, done, speed = self.total_bytes, self.done_bytes, self.speed()
        eta = (total - done) / speed if total is not None and speed > 0 else None
        snapshot: dict[str, Any] = {
            "id": self.id,
            "object": "pull",
            "kind": self.kind,
            "model": self.model,
            "status": self.status,
            "done_bytes": done,
            "total_bytes": total,
            "percent": round(100.0 * done / total, 1) if total else None,
            "bytes_per_second": round(speed),
            "eta_seconds": None if eta is None or self.finished else round(eta, 1),
            "started": self.started,
            "files": [
                {
                    "url": spec.url,
                    "path": str(spec.dest),
                    "done_bytes": self.positions.get(spec.dest, 0),
                    "total_bytes": self.sizes.get(spec.dest),
                }
                for spec in self.files
            ],
            "error": None,
        }
        if self.error is not None:
            snapshot["error"] = {"code": self.error.code, "message": self.error.message}
        return snapshot

    async def run(self, downloader: Downloader) -> None:
        """Fetch every file in turn; the pull ends done or failed (never raises KronkError)."""
        try:
            for spec in self.files:
                await downloader.fetch(spec, self.listener(spec))
            self.status = "done"
        except KronkError as exc:
            self.status, self.error = "failed", exc
        except (OSError, httpx.HTTPError) as exc:  # a local file error, a malformed URL
            log.exception("pull of %s failed", self.model)
            self.status, self.error = "failed", PullError(f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError:
            self.status, self.error = "failed", KronkError("the pull was cancelled")
            raise
        finally:
            self.touch()

    async def watch(self) -> AsyncIterator[dict[str, Any]]:
        """Snapshots as the pull moves (at most EVENTS_PER_SECOND), the last one final."""
        while True:
            # The pull may end while a watcher holds a snapshot: whether to go on is read
            # from the snapshot sent, so that the last one sent is always the final one.
            seen, snapshot = self.version, self.snapshot()
            yield snapshot
            if snapshot["status"] != "running":
                return
            await self.changed(seen)
            if not self.finished:
                await asyncio.sleep(1.0 / EVENTS_PER_SECOND)


class Pulls:
    """The server's pulls by id. A model already being pulled is not pulled twice."""

    def __init__(self, downloader: Downloader) -> None:
        self.downloader = downloader
        self._pulls: dict[str, Pull] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, model: str, files: Sequence[FileSpec], kind: str) -> Pull:
        for pull in self._pulls.values():
            if pull.model == model and not pull.finished:
                return pull
        pull = Pull(model=model, files=files, kind=kind)
        self._pulls[pull.id] = pull
        task = asyncio.ensure_future(pull.run(self.downloader))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return pull

    def get(self, pull_id: str) -> Pull:
        pull = self._pulls.get(pull_id)
        if pull is None:
            raise NotFoundError(f"no pull {pull_id!r}", param="id")
        return pull

    def list(self) -> list[Pull]:
        return sorted(self._pulls.values(), key=lambda pull: pull.started, reverse=True)

    def cancel(self) -> None:
        """Stop every pull; their partial files stay, for the next pull to resume."""
        for task in list(self._tasks):
            task.cancel()
