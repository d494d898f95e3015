"""Logs with the request id of the request being served: readable text on a terminal, one JSON
object per line elsewhere (a file, a pipe, a log collector) or when asked."""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime
from typing import Any, Literal

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from kronk_core.contract.records import current_request_id, new_request_id

# The core's: the SDK hands it to the engine, whose log lines then carry it too.
request_id = current_request_id


LogFormat = Literal["auto", "text", "json"]


def iso_time(record: logging.LogRecord) -> str:
    """ISO 8601 in local time with its UTC offset, to the millisecond."""
    return datetime.fromtimestamp(record.created).astimezone().isoformat(timespec="milliseconds")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": iso_time(record),
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


class TextFormatter(logging.Formatter):
    """`2025-01-31T09:00:00.123+01:00 INFO  kronk_core.runtime.pool: loaded ... [request id]`."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{iso_time(record)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        current = request_id.get()
        if current is not None:
            line += f" [{current}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(level: str, log_format: LogFormat = "auto") -> None:
    """Log to stderr: text when it is a terminal (or asked for), else JSON."""
    handler = logging.StreamHandler(sys.stderr)
    text = log_format == "text" or (log_format == "auto" and sys.stderr.isatty())
    handler.setFormatter(TextFormatter() if text else JsonFormatter())
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
