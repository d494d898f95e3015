"""Limits on connections, enforced in uvicorn's HTTP protocol before the app sees a request.

uvicorn hands the ASGI app nothing until a request's headers are complete, so these live in
a subclass of its h11 protocol (`ConnectionGuard.uvicorn_options` pins it):

- read_header_timeout: a connection whose request headers have not all arrived that long
  after it opened (or, on a kept-alive connection, after the next request's first byte) is
  closed, with a 408 when part of a request came. uvicorn has no such deadline: a client
  trickling one header line every few seconds held its connection forever (slowloris).
- max_connections_per_client: a connection beyond that many open ones from the same
  address is answered 429 and closed.
- max_header_bytes: a request line and headers larger than that are answered 400, in JSON.
  h11 alone bounds only headers still arriving, and uvicorn answered that with a plain-text
  400 and closed at once, so that a client still sending saw its connection reset.

Each answer here has the dialect-neutral error body of pre-routing errors, says
`Connection: close`, and is followed by a short lingering close: what the client still
sends is read and dropped for up to LINGER_SECONDS, so the answer is not lost to a reset.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol
from uvicorn.server import ServerState

from kronk_api.dialect import Dialect
from kronk_core.contract.errors import (
    InvalidRequestError,
    KronkError,
    LimitExceededError,
    RequestTimeoutError,
    TooManyRequestsError,
)

log = logging.getLogger(__name__)

# How long a refused connection's further input is read and dropped before it is closed.
LINGER_SECONDS = 2.0

_NextEvent = h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]


@dataclass
class ConnectionGuard:
    """One server's connection limits, and its open connections by client address."""

    read_header_timeout: float
    max_connections_per_client: int
    max_header_bytes: int
    open: Counter[str] = field(default_factory=Counter, init=False)
    # Addresses whose refusals were logged, until they are under the cap again.
    reported: set[str] = field(default_factory=set, init=False, repr=False)

    def uvicorn_options(self) -> dict[str, Any]:
        """uvicorn.Config options that put these limits in force."""
        guard = self

        class Guarded(GuardedH11Protocol):
            limits = guard

        # "none": an upgraded connection would leave this protocol, and the count with it.
        return {"http": Guarded, "ws": "none"}

    def admit(self, address: str) -> bool:
        """Count a new connection from `address`, or say it is one too many."""
        if self.open[address] < self.max_connections_per_client:
            self.open[address] += 1
            return True
        if address not in self.reported:  # once per burst: a flood must not flood the log
            self.reported.add(address)
            log.warning(
                "%s has %d connections open (max_connections_per_client): more are refused",
                address,
                self.open[address],
            )
        return False

    def release(self, address: str) -> None:
        self.open[address] -= 1
        if self.open[address] <= 0:
            del self.open[address]
        if self.open[address] < self.max_connections_per_client:
            self.reported.discard(address)


class _Requests(h11.Connection):
    """h11's server side, telling its protocol when a request's headers are complete, and
    refusing headers past the limit however they arrived."""

    def __init__(self, protocol: GuardedH11Protocol, max_header_bytes: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_header_bytes)
        self.protocol = protocol
        self.max_header_bytes = max_header_bytes
        self.refused: h11.RemoteProtocolError | None = None

    def next_event(self) -> _NextEvent:
        try:
            event = super().next_event()
            if isinstance(event, h11.Request):
                self.protocol.headers_complete()
                if _header_bytes(event) > self.max_header_bytes:
                    raise h11.RemoteProtocolError(
                        "request headers too large", error_status_hint=431
                    )
        except h11.RemoteProtocolError as exc:
            self.refused = exc  # uvicorn answers it through send_400_response
            raise
        return event


def _header_bytes(request: h11.Request) -> int:
    """The size of a request's line and headers as sent (give or take their spacing)."""
    line = len(request.method) + len(request.target) + 11
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol under a ConnectionGuard (the subclass `uvicorn_options` makes
    sets `limits`)."""

    limits: ClassVar[ConnectionGuard]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.requests = _Requests(self, self.limits.max_header_bytes)
        self.conn = self.requests
        self.counted: str | None = None  # the address this connection counts against
        self.header_timer: asyncio.TimerHandle | None = None
        self.linger_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = self.client[0] if self.client else None
        if address is not None:
            if not self.limits.admit(address):
                limit = self.limits.max_connections_per_client
                self.refuse(
                    TooManyRequestsError(
                        f"more than {limit} connections open from {address} "
                        "(max_connections_per_client); close some and retry"
                    )
                )
                return
            self.counted = address
        self._start_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        if self.linger_timer is not None:
            self.linger_timer.cancel()
        if self.counted is not None:
            self.limits.release(self.counted)
            self.counted = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.linger_timer is not None:
            return  # refused: dropped
        # The client has not sent a whole request line and headers yet: the next request
        # begins (on a kept-alive connection the idle timeout ran until now).
        if self.header_timer is None and self.conn.their_state is h11.IDLE:
            self._start_header_timer()
        super().data_received(data)

    def headers_complete(self) -> None:
        self._cancel_header_timer()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 refused: JSON, and a lingering close."""
        refused = self.requests.refused
        if refused is not None and refused.error_status_hint == 431:
            error: KronkError = LimitExceededError(
                f"the request's headers are larger than {self.limits.max_header_bytes} bytes "
                "(max_header_bytes)"
            )
            log.warning("%s: %s: 400", self._peer(), error.message)
        else:
            detail = f": {refused}" if refused is not None else ""
            error = InvalidRequestError(f"malformed HTTP request{detail}")
        self.refuse(error)

    def refuse(self, error: KronkError) -> None:
        """Answer `error`, then close once the client stops sending (LINGER_SECONDS at most)."""
        self._cancel_header_timer()
        self._unset_keepalive_if_required()
        if self.transport.is_closing():
            return
        # A response already under way cannot be followed by another: only close then.
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            self.transport.write(self._error_response(error))
        self.linger_timer = self.loop.call_later(LINGER_SECONDS, self.transport.close)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_reading()

    def _error_response(self, error: KronkError) -> bytes:
        dialect = Dialect()
        body = json.dumps(
            dialect.error_body(error.status, dialect.message(error), error.code, error.param)
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        if error.retry_after is not None:
            headers.append((b"retry-after", str(error.retry_after).encode()))
        status = error.status
        response = h11.Response(status_code=status, headers=headers, reason=STATUS_PHRASES[status])
        return b"".join(
            self.conn.send(event) or b""
            for event in (response, h11.Data(data=body), h11.EndOfMessage())
        )

    def _start_header_timer(self) -> None:
        self.header_timer = self.loop.call_later(
            self.limits.read_header_timeout, self._header_timeout
        )

    def _cancel_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _header_timeout(self) -> None:
        self.header_timer = None
        if self.transport.is_closing():
            return
        seconds = self.limits.read_header_timeout
        if not self.conn.trailing_data[0]:
            # Nothing of a request came (an idle pre-connect): closed without a word.
            log.debug(
                "%s: no request within %gs (read_header_timeout): closed", self._peer(), seconds
            )
            self.transport.close()
            return
        log.warning(
            "%s: request headers did not arrive within %gs (read_header_timeout): 408",
            self._peer(),
            seconds,
        )
        self.refuse(
            RequestTimeoutError(
                f"the request's headers did not arrive within {seconds:g} seconds "
                "(read_header_timeout)"
            )
        )

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
