"""Anthropic's shape of errors and stream frames: {"type": "error", "error": {"type", "message"},
"request_id"}, the `error` event, and `ping` for keep-alive."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from kronk_api.contract import Dialect, request_id, sse_frame
from kronk_core.contract import ContextOverflowError, KronkError


class AnthropicDialect(Dialect):
    error_types: ClassVar[Mapping[int, str]] = {
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
    server_error_type: ClassVar[str] = "api_error"
    keepalive_frame: ClassVar[bytes] = sse_frame({"type": "ping"}, "ping")

    def error_body(self, status: int, message: str, code: str, param: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": "error",
            "error": {"type": self.error_type(status), "message": message},
        }
        current = request_id.get()
        if current is not None:
            body["request_id"] = current
        return body

    def message(self, error: KronkError) -> str:
        if not isinstance(error, ContextOverflowError):
            return super().message(error)
        # Anthropic's wording, which Claude Code reads as its cue to compact the conversation
        # (and, from the two counts, by how much). The prompt may hold one token less than
        # the window: the answer needs one.
        if error.prompt_tokens is None or error.context_window is None:
            return f"prompt is too long: {error.message}"
        return (
            f"prompt is too long: {error.prompt_tokens} tokens > {error.context_window - 1} "
            f"maximum ({error.message})"
        )

    def stream_error(self, error: KronkError) -> bytes:
        return sse_frame(self._kronk_body(error), "error")


ANTHROPIC = AnthropicDialect()
