"""An engine's own thread: the `EngineThread` of a model that does not choose one."""

from __future__ import annotations

import threading
from collections.abc import Callable


class OwnThread:
    """A daemon thread for the loop, which idles on an event that `wake` sets."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, loop: Callable[[], None]) -> None:
        self._thread = threading.Thread(target=loop, name=self._name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def idle(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
