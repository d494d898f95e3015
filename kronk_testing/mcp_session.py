"""MCP sessions spoken as plain HTTP (`RawSession`), and the shapes of the MCP plugin's
fixtures (`RawFactory`, `ServiceFactory`) for its tests' annotations."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

ACCEPT = "application/json, text/event-stream"


def rpc_answer(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of an answer sent as JSON or as one server-sent event."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        answer: dict[str, Any] = json.loads(data[-1])
        return answer
    answer = response.json()
    return answer


@dataclass
class RawSession:
    """One MCP session spoken as plain HTTP, the way docs/mcp.md's curl examples do."""

    http: httpx.Client
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    session_id: str | None = None
    next_id: int = 1

    def post(self, message: dict[str, Any]) -> httpx.Response:
        headers = {"Accept": ACCEPT, **self.headers}
        if self.session_id is not None:
            headers["Mcp-Session-Id"] = self.session_id
            headers["Mcp-Protocol-Version"] = "2025-06-18"
        return self.http.post(self.url, json=message, headers=headers)

    def initialize(self) -> httpx.Response:
        response = self.post(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "curl", "version": "8"},
                },
            }
        )
        if response.status_code == 200:
            self.session_id = response.headers["mcp-session-id"]
            initialized = self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
            assert initialized.status_code == 202, initialized.text
        return response

    def call(self, method: str, params: dict[str, Any] | None = None) -> httpx.Response:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            message["params"] = params
        self.next_id += 1
        return self.post(message)

    answer = staticmethod(rpc_answer)

    def result(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        response = self.call(method, params)
        assert response.status_code == 200, response.text
        answer = rpc_answer(response)
        assert "result" in answer, answer
        result: dict[str, Any] = answer["result"]
        return result


RawFactory = Callable[..., RawSession]


# `with mcp_service(**settings) as url:` (the MCP plugin's fixture).
ServiceFactory = Callable[..., contextlib.AbstractContextManager[str]]
