"""The manual's read and write timeouts, which uvicorn lacks, as the server's outermost ASGI app.

- read timeout: a request whose body has not fully arrived that long after the request
  began is answered 408 and its connection closed; the app sees the client gone.
- write timeout: a response whose client stops reading (its socket buffers full, so a send
  waits) for that long loses its connection, as if the client had left: the app's
  disconnect handling cancels the generation and frees its slot.

The idle (keep-alive) and shutdown timeouts are uvicorn's own settings (kronk_api.cli.serve).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send

from kronk_api.dialect import Dialect
from kronk_core.contract.errors import RequestTimeoutError

log = logging.getLogger(__name__)

_DISCONNECT: ReceiveMessage = {"type": "http.disconnect"}


def _transport(send: Send) -> asyncio.Transport | None:
    """The connection under uvicorn's `send` (a method of its request cycle), if any."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    return transport if isinstance(transport, asyncio.BaseTransport) else None  # type: ignore[return-value]


class ClientStoppedReading(Exception):
    """A response waited for its client longer than the write timeout (a server whose
    connection Kronk cannot drop ends the response with this)."""


class HttpTimeouts:
    """Wraps an ASGI app: HTTP requests get the read and write timeouts (in seconds)."""

    def __init__(self, app: ASGIApp, read_timeout: float, write_timeout: float) -> None:
        self.app = app
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        await _Exchange(self, scope, receive, send).run()


class _Exchange:
    """One request and its response under the timeouts."""

    def __init__(self, limits: HttpTimeouts, scope: Scope, receive: Receive, send: Send) -> None:
        self.limits = limits
        self.scope = scope
        self._receive = receive
        self._send = send
        self.deadline = time.monotonic() + limits.read_timeout
        self.body_done = False
        self.started = False
        self.answered = False  # we sent the 408: the app's messages go nowhere

    async def run(self) -> None:
        await self.limits.app(self.scope, self.receive, self.send)

    async def receive(self) -> ReceiveMessage:
        if self.answered:
            return _DISCONNECT
        if self.body_done:
            return await self._receive()  # waiting for a disconnect: no deadline
        try:
            message = await asyncio.wait_for(
                self._receive(), max(0.0, self.deadline - time.monotonic())
            )
        except TimeoutError:
            await self._read_timed_out()
            return _DISCONNECT
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.body_done = True
        return message

    async def _read_timed_out(self) -> None:
        log.warning(
            "%s %s: the request body did not arrive within the read timeout (%gs): 408",
            self.scope.get("method"),
            self.scope.get("path"),
            self.limits.read_timeout,
        )
        self.body_done = True
        if self.started:
            return  # the app answered before reading all of it; let it finish
        self.answered = True
        error = RequestTimeoutError(
            f"the request body did not arrive within {self.limits.read_timeout:g} seconds"
        )
        body = json.dumps(
            Dialect().error_body(error.status, error.message, error.code, error.param)
        ).encode()
        await self._send(
            {
                "type": "http.response.start",
                "status": error.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def send(self, message: Message) -> None:
        if self.answered:
            return
        if message["type"] == "http.response.start":
            self.started = True
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        try:
            await asyncio.wait_for(self._send(message), self.limits.write_timeout)
        except TimeoutError:
            self._write_timed_out()

    def _write_timed_out(self) -> None:
        log.warning(
            "%s %s: the client read nothing for the write timeout (%gs): connection dropped",
            self.scope.get("method"),
            self.scope.get("path"),
            self.limits.write_timeout,
        )
        transport = _transport(self._send)
        if transport is None:
            raise ClientStoppedReading(self.limits.write_timeout)
        # uvicorn then reports the client gone to the app (http.disconnect), as for a
        # client that left: the stream is cancelled there.
        transport.abort()

