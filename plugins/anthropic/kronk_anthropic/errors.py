"""Errors in Anthropic's shape: {"type": "error", "error": {"type", "message"}, "request_id"}."""

from __future__ import annotations

import json
import logging
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException

from kronk_api.errors import client_message
from kronk_api.logs import request_id
from kronk_core.errors import ContextOverflowError, KronkError

log = logging.getLogger(__name__)

# Anthropic's error types by status; other 4xx are invalid_request_error, other 5xx api_error.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    return _TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def error_body(status: int, message: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": "error",
        "error": {"type": error_type(status), "message": message},
    }
    current = request_id.get()
    if current is not None:
        body["request_id"] = current
    return body


def _message(error: KronkError) -> str:
    if isinstance(error, ContextOverflowError):
        # Claude Code recognises this prefix and compacts the conversation.
        return f"prompt is too long: {error.message}"
    return client_message(error)


def error_response(error: KronkError) -> Response[dict[str, Any]]:
    headers = {} if error.retry_after is None else {"Retry-After": str(error.retry_after)}
    return Response(
        error_body(error.status, _message(error)), status_code=error.status, headers=headers
    )


def sse_error(error: KronkError) -> bytes:
    """The `error` event of a stream that has already started (its status is already 200)."""
    return (
        f"event: error\ndata: {json.dumps(error_body(error.status, _message(error)))}\n\n".encode()
    )


def handle_kronk_error(_: Request[Any, Any, Any], exc: KronkError) -> Response[Any]:
    return error_response(exc)


def handle_http_error(_: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    """Litestar's own errors on these routes (405, 413 body too large, ...)."""
    status = exc.status_code
    return Response(error_body(status, exc.detail), status_code=status, headers=exc.headers)


def handle_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return Response(error_body(500, "internal server error"), status_code=500)
