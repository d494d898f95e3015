"""Request ids on responses and in JSON log lines."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

import httpx

from kronk_api.logs import JsonFormatter, request_id

if TYPE_CHECKING:
    from conftest import RunningServer


def test_request_id_is_echoed_or_made(server: RunningServer) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        given = client.get("/v1/liveness", headers={"X-Request-ID": "abc-123"})
        made = client.get("/v1/liveness")
    assert given.headers["x-request-id"] == "abc-123"
    assert len(made.headers["x-request-id"]) == 32


def test_json_log_line_carries_the_request_id() -> None:
    record = logging.LogRecord("kronk", logging.INFO, __file__, 1, 'said "%s"', ("hi",), None)
    token = request_id.set("req-7")
    try:
        line = json.loads(JsonFormatter().format(record))
    finally:
        request_id.reset(token)
    assert line["msg"] == 'said "hi"'
    assert line["request_id"] == "req-7"
    assert line["level"] == "INFO" and line["logger"] == "kronk"
