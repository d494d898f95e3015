"""Limits on every request body, whatever route it is for: size, JSON nesting, strings, arrays.

One guard on every route, so dialects added later are covered without
touching their schemas. Its errors are `KronkError`s, which each dialect's
router answers in its own error shape.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.handlers import BaseRouteHandler

from kronk_core.contract.errors import InvalidRequestError, RequestTooLargeError

log = logging.getLogger(__name__)

_METHODS_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
# Checking a big body takes a while; do it off the event loop so other requests go on.
_THREAD_THRESHOLD = 1 << 20
# Where the guard leaves the decoded JSON body for the handler (kronk_api.http.parse_body).
PARSED_BODY = "kronk_parsed_body"
# With insecure logging on, how much of a body to log.
_LOGGED_BYTES = 16 << 10


@dataclass(frozen=True)
class BodyLimits:
    max_bytes: int
    max_depth: int
    max_string_length: int
    max_items: int
    log_bodies: bool = False


def check_json(body: bytes, limits: BodyLimits) -> Any:
    """The decoded body; InvalidRequestError unless it is JSON within the nesting, string and
    array limits."""
    try:
        data = json.loads(body)
    except RecursionError:
        raise InvalidRequestError(
            f"request body is nested deeper than {limits.max_depth} levels"
        ) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, too many int digits
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from None
    # Iterative, so a deep document cannot exhaust the stack.
    pending: list[tuple[Any, int]] = [(data, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, str):
            if len(value) > limits.max_string_length:
                raise InvalidRequestError(
                    f"a string in the request body is longer than "
                    f"{limits.max_string_length} characters"
                )
            _check_unicode(value)
            continue
        if not isinstance(value, dict | list):
            continue
        if depth > limits.max_depth:
            raise InvalidRequestError(
                f"request body is nested deeper than {limits.max_depth} levels"
            )
        if len(value) > limits.max_items:
            kind = "an object" if isinstance(value, dict) else "an array"
            raise InvalidRequestError(
                f"{kind} in the request body has more than {limits.max_items} items"
            )
        if isinstance(value, dict):
            pending.extend((key, depth + 1) for key in value)
            pending.extend((item, depth + 1) for item in value.values())
        else:
            pending.extend((item, depth + 1) for item in value)
    return data


def _check_unicode(value: str) -> None:
    """JSON's `\\ud800` escapes decode to lone surrogates, which no UTF-8 consumer (the
    tokenizer, a grammar, a log line) can take."""
    if value.isascii():
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(
            f"a string in the request body is not valid Unicode: it holds the lone surrogate "
            f"{value[exc.start]!r} at character {exc.start}"
        ) from None


def body_guard(limits: BodyLimits) -> Callable[..., Awaitable[None]]:
    """A Litestar guard that reads the body within max_bytes and checks it.

    It runs after the plugins' guards, so an unauthenticated body is never
    read. Bodies are JSON on every route except multipart uploads, whose size
    alone is limited. The handler gets the body Litestar has cached.
    """

    async def check_request_body(
        connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
    ) -> None:
        if connection.scope.get("method") not in _METHODS_WITH_BODY:
            return
        if not isinstance(connection, Request):
            return  # a websocket: no body to check
        try:
            body = await connection.body()  # Litestar stops reading past max_bytes
        except RequestEntityTooLarge:
            raise RequestTooLargeError(
                f"request body is larger than {limits.max_bytes} bytes"
            ) from None
        if limits.log_bodies:
            log.info("request body: %s", body[:_LOGGED_BYTES].decode("utf-8", "replace"))
        if not body or connection.headers.get("content-type", "").startswith("multipart/"):
            return
        if len(body) > _THREAD_THRESHOLD:
            data = await asyncio.to_thread(check_json, body, limits)
        else:
            data = check_json(body, limits)
        # Handlers take it from here instead of decoding the body a second time.
        connection.state[PARSED_BODY] = data

    return check_request_body
