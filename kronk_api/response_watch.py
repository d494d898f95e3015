"""An ASGI `send` wrapper for middleware that reports on each response (metrics, spans)."""

from __future__ import annotations

from collections.abc import Callable

from litestar.types import Message, Send


class ResponseWatch:
    """Wraps `send`; calls `done(status)` once, just before the response's last body
    message leaves.

    Before, not after: a client holding the whole response can count on `done`
    having run (a test that scrapes metrics or flushes spans right after its
    request). Call `finish()` when the app returns or raises: it runs `done`
    for a response that never completed (an exception, a client gone), with
    status 500 if none was sent.
    """

    def __init__(self, send: Send, done: Callable[[int], None]) -> None:
        self._send = send
        self._done = done
        self._finished = False
        self.status = 500

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.finish()
        await self._send(message)

    def finish(self) -> None:
        if not self._finished:
            self._finished = True
            self._done(self.status)
