"""Structured (JSON) logs, one object per line, with the request id of the request being served."""

from __future__ import annotations

import json
import logging
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from kronk_core.events import current_request_id, new_request_id

# The core's: the SDK hands it to the engine, whose log lines then carry it too.
request_id = current_request_id


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        current = request_id.get()
        if current is not None:
            entry["request_id"] = current
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level.upper())


def request_ids(app: ASGIApp) -> ASGIApp:
    """ASGI middleware: take X-Request-ID from the client or make one; echo it back."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        current = given[:128] or new_request_id()
        token = request_id.set(current)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", current.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await app(scope, receive, send_with_id)
        finally:
            request_id.reset(token)

    return middleware
