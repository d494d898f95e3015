"""The plumbing every API dialect shares: the route prologue, error responses, stream start
and its error tail, SSE framing, keep-alive and client-disconnect handling.

A dialect subclasses `Dialect` and overrides only what differs: its error
body, its error message, its error event and its keep-alive frame. The base
class speaks OpenAI's shape, which is also the server's own (health and
admin routes, unknown paths).
"""

from __future__ import annotations

import asyncio
import json
import logging
import traceback
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

from litestar import Request, Response
from litestar.background_tasks import BackgroundTask
from litestar.exceptions import HTTPException
from litestar.response import Stream
from litestar.types import ExceptionHandlersMap
from pydantic import BaseModel

from kronk_api.disconnect import ClientDisconnected, unless_disconnected
from kronk_api.endpoints import subject_of
from kronk_api.errors import client_message
from kronk_api.http import kronk_of, media_sources, parse_body
from kronk_core.contract.errors import KronkError
from kronk_core.contract.media import MediaSources
from kronk_core.sdk import Kronk

log = logging.getLogger(__name__)

T = TypeVar("T")
Body = TypeVar("Body", bound=BaseModel)

# nginx's code for "client closed the request"; nobody receives it, the log shows it.
CLIENT_CLOSED_REQUEST = 499
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# Silence longer than this (a long prefill, a slow model) gets a keep-alive frame, so
# proxies and clients with read timeouts keep the connection open.
KEEPALIVE_SECONDS = 10.0


def sse_frame(payload: Mapping[str, Any], event: str | None = None) -> bytes:
    """One server-sent event: `data:` with the JSON payload, after `event:` when named."""
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {json.dumps(payload)}\n\n".encode()


@runtime_checkable
class NamesMedia(Protocol):
    """A request body whose messages may name images by URL, fetched before it is served."""

    @property
    def model(self) -> str | None: ...

    def media_urls(self) -> list[str]: ...


@dataclass(frozen=True)
class Received(Generic[Body]):
    """A route's request, as the prologue every dialect shares leaves it."""

    body: Body
    kronk: Kronk
    # The authenticated caller (None without auth), whose request the model serves.
    subject: str | None
    # The media limits, with the images the body's URLs name fetched.
    sources: MediaSources


async def receive(request: Request[Any, Any, Any], schema: type[Body]) -> Received[Body]:
    """The prologue of a dialect's route: the body parsed as `schema` (a 400 in the dialect's
    shape when it does not fit), the SDK facade, the caller, and the image URLs a body that
    `NamesMedia` names fetched (see `media_sources`)."""
    body = await parse_body(request, schema)
    kronk = kronk_of(request)
    if isinstance(body, NamesMedia):
        sources = await media_sources(request, body.model, body.media_urls())
    else:
        sources = MediaSources(kronk.config.media)
    return Received(body, kronk, subject_of(request), sources)


class Dialect:
    """An API dialect's error shape and stream frames; OpenAI's unless overridden."""

    # Error `type` by status; any other 4xx is client_error_type, any other 5xx server_error_type.
    error_types: ClassVar[Mapping[int, str]] = {
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_error",
        503: "service_unavailable",
    }
    client_error_type: ClassVar[str] = "invalid_request_error"
    server_error_type: ClassVar[str] = "server_error"
    # Error codes this dialect's clients know under another name (KronkError.code → it).
    codes: ClassVar[Mapping[str, str]] = {}
    # An SSE comment: clients skip it.
    keepalive_frame: ClassVar[bytes] = b": keep-alive\n\n"
    stream_media_type: ClassVar[str] = "text/event-stream"

    def error_type(self, status: int) -> str:
        fallback = self.client_error_type if status < 500 else self.server_error_type
        return self.error_types.get(status, fallback)

    def error_body(self, status: int, message: str, code: str, param: str | None) -> dict[str, Any]:
        return {
            "error": {
                "message": message,
                "type": self.error_type(status),
                "code": code,
                "param": param,
            }
        }

    def message(self, error: KronkError) -> str:
        """What the client reads of an error (a 500's details stay in the log)."""
        return client_message(error)

    def stream_error(self, error: KronkError) -> bytes:
        """The error frame of a stream that has already started (its status is already 200)."""
        return sse_frame(self._kronk_body(error))

    def _kronk_body(self, error: KronkError) -> dict[str, Any]:
        code = self.codes.get(error.code, error.code)
        return self.error_body(error.status, self.message(error), code, error.param)

    # ---- the same for every dialect --------------------------------------------------

    def error_response(self, error: KronkError) -> Response[dict[str, Any]]:
        headers = {} if error.retry_after is None else {"Retry-After": str(error.retry_after)}
        return Response(self._kronk_body(error), status_code=error.status, headers=headers)

    def http_error_response(self, exc: HTTPException) -> Response[dict[str, Any]]:
        """Litestar's own errors (404 unknown path, 405, 413 from the body limit, ...)."""
        status = exc.status_code
        body = self.error_body(status, exc.detail, str(status), None)
        return Response(body, status_code=status, headers=exc.headers)

    def internal_error_response(
        self, request: Request[Any, Any, Any], exc: Exception
    ) -> Response[dict[str, Any]]:
        """An unexpected exception: logged (its message only with insecure logging), 500."""
        if request.app.state.settings.insecure_logging:
            log.exception(
                "unhandled error on %s %s", request.method, request.url.path, exc_info=exc
            )
        else:
            # The exception's message may quote the request (prompt text); the stack alone
            # locates the bug.
            stack = "".join(traceback.format_tb(exc.__traceback__))
            log.error(
                "unhandled %s on %s %s\n%s",
                type(exc).__name__,
                request.method,
                request.url.path,
                stack,
            )
        return Response(
            self.error_body(500, "internal server error", "internal", None), status_code=500
        )

    def exception_handlers(self) -> ExceptionHandlersMap:
        """Handlers for a dialect's Router, so that every error on its routes (the guards'
        too) comes out in its shape."""
        return {
            KronkError: lambda _, exc: self.error_response(exc),
            # The client left while the handler waited (fetching its image URLs).
            ClientDisconnected: lambda _, __: Response(None, status_code=CLIENT_CLOSED_REQUEST),
            HTTPException: lambda _, exc: self.http_error_response(exc),
            Exception: self.internal_error_response,
        }

    async def respond(
        self, request: Request[Any, Any, Any], work: Awaitable[T]
    ) -> T | Response[None]:
        """Await a whole answer; if the client leaves first, stop the work and log a 499."""
        try:
            return await unless_disconnected(request, work)
        except ClientDisconnected:
            return Response(None, status_code=CLIENT_CLOSED_REQUEST)

    async def with_stream_errors(self, frames: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The frames of a stream; a KronkError past its start (its 200 already sent) ends
        them with the dialect's error frame."""
        try:
            async for frame in frames:
                yield frame
        except KronkError as error:
            yield self.stream_error(error)

    async def open_stream(
        self,
        request: Request[Any, Any, Any],
        items: AsyncIterator[T],
        frames: Callable[[AsyncIterator[T]], AsyncIterator[bytes]],
        keepalive_frame: bytes | None = None,
    ) -> Stream | Response[None]:
        """Start a streamed answer (server-sent events, unless the dialect streams another
        way) with `frames(items)`, ended by the dialect's error frame on an error
        (`with_stream_errors`); `keepalive_frame` replaces the dialect's for this stream.

        It waits for the first item, so that an error at the start (a bad
        grammar, a full queue) still gets its status code, but no longer than
        KEEPALIVE_SECONDS: a long prefill starts the stream and its
        keep-alive frames. A client that leaves first gets a 499 in the log.
        """
        first = asyncio.ensure_future(anext(items))
        try:
            await unless_disconnected(request, asyncio.wait({first}, timeout=KEEPALIVE_SECONDS))
        except ClientDisconnected:
            first.cancel()
            return Response(None, status_code=CLIENT_CLOSED_REQUEST)
        if first.done():
            error = first.exception()
            if error is not None and not isinstance(error, StopAsyncIteration):
                raise error
        frame = keepalive_frame or self.keepalive_frame
        framed = self.with_stream_errors(frames(_resume(first, items)))
        stream = keepalive(framed, frame, KEEPALIVE_SECONDS)

        async def close() -> None:
            # A client that leaves while a frame is being sent leaves every generator of
            # the stream suspended at a frame, and the generation running until the garbage
            # collector finds them: closing the ends once the response is over stops it.
            await stream.aclose()
            if isinstance(items, AsyncGenerator):
                await items.aclose()

        return Stream(
            stream,
            media_type=self.stream_media_type,
            headers=SSE_HEADERS,
            background=BackgroundTask(close),
        )


async def _resume(first: asyncio.Future[T], rest: AsyncIterator[T]) -> AsyncIterator[T]:
    """The item `first` reads (awaited if need be), then the rest."""
    try:
        yield await first
    except StopAsyncIteration:
        return
    async for item in rest:
        yield item


async def keepalive(
    frames: AsyncIterator[bytes], frame: bytes, interval: float
) -> AsyncGenerator[bytes, None]:
    """The frames, with `frame` whenever `interval` seconds pass without one.

    Leaving early cancels the pending read, and with it the generation.
    """
    pending = asyncio.ensure_future(anext(frames))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield frame
                continue
            try:
                yield pending.result()
            except StopAsyncIteration:
                return
            pending = asyncio.ensure_future(anext(frames))
    finally:
        pending.cancel()


class KronkDialect(Dialect):
    """The server's own routes (/v1/kronk/..., health, unknown paths): OpenAI's shape, with
    the codes of the Kronk manual's error table (§8.10), which its clients read. The
    OpenAI-compatible routes keep OpenAI's `model_not_found`."""

    codes: ClassVar[Mapping[str, str]] = {
        "model_not_found": "not_found",
        "invalid_token": "unauthenticated",
    }
