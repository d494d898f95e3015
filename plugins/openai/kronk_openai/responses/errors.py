"""KronkError → the Responses API's shape: OpenAI's error body, with OpenAI's words for a
prompt past the context window, which clients match to compact the conversation (OpenCode's
patterns include "exceeds the context window"; Codex reads the code)."""

from __future__ import annotations

from kronk_api.contract import Dialect
from kronk_core.contract import ContextOverflowError, KronkError


class ResponsesDialect(Dialect):
    def message(self, error: KronkError) -> str:
        if isinstance(error, ContextOverflowError):
            return f"Your input exceeds the context window of this model: {error.message}"
        return super().message(error)


RESPONSES_ERRORS = ResponsesDialect()
