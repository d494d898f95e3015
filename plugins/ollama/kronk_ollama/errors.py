"""Ollama's shape of errors: `{"error": "..."}` with the status, and the same object as a line
of a stream that has already started."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from kronk_api.contract import Dialect
from kronk_core.contract import KronkError

NDJSON = "application/x-ndjson"


def ndjson_line(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload).encode() + b"\n"


class OllamaDialect(Dialect):
    stream_media_type: ClassVar[str] = NDJSON

    def error_body(self, status: int, message: str, code: str, param: str | None) -> dict[str, Any]:
        return {"error": message}

    def stream_error(self, error: KronkError) -> bytes:
        return ndjson_line(self._kronk_body(error))


OLLAMA = OllamaDialect()
