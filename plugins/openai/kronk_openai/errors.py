"""KronkError → OpenAI's error shape: {"error": {"message", "type", "code", "param"}}."""

from __future__ import annotations

import json
from typing import Any

from litestar import Response

from kronk_api.errors import client_message
from kronk_core.errors import KronkError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


def error_body(status: int, message: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "server_error"),
            "code": code,
            "param": param,
        }
    }


def error_response(error: KronkError) -> Response[dict[str, Any]]:
    headers = {} if error.retry_after is None else {"Retry-After": str(error.retry_after)}
    return Response(
        error_body(error.status, client_message(error), error.code, error.param),
        status_code=error.status,
        headers=headers,
    )


def sse_error(error: KronkError) -> bytes:
    """An error event for a stream that has already started."""
    body = error_body(error.status, client_message(error), error.code, error.param)
    return f"data: {json.dumps(body)}\n\n".encode()
