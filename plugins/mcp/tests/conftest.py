"""A local server speaking the Brave Search web search API, and the MCP service in-process.

The Brave Search API cannot be reached from here, so `BraveSearchDouble`
answers `GET /res/v1/web/search` the way Brave does: the key in the
`X-Subscription-Token` header (a wrong one: 422 SUBSCRIPTION_TOKEN_INVALID),
`q`, `count`, `country`, `safesearch` and `freshness` as query parameters,
a WebSearchApiResponse (`web.results[]` with title, url, description and,
for some, age) and ErrorResponse bodies. Tests queue other answers with
`answer_next` and `hang_next`.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from kronk_mcp.service import BackgroundService, mcp_app
from kronk_mcp.settings import McpSettings

BRAVE_KEY = "BSA-test-key-7f3c9e"
SEARCH_PATH = "/res/v1/web/search"


@dataclass(frozen=True)
class BraveRequest:
    path: str
    params: dict[str, str]
    headers: dict[str, str]


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False


def brave_error(status: int, code: str, detail: str) -> dict[str, Any]:
    """Brave's ErrorResponse body."""
    return {
        "type": "ErrorResponse",
        "error": {"id": "5d832250-9396", "status": status, "code": code, "detail": detail},
        "time": 1663072993,
    }


def web_results(query: str, count: int) -> dict[str, Any]:
    """A WebSearchApiResponse with `count` results; every other one has an age."""
    results = []
    for number in range(1, count + 1):
        result: dict[str, Any] = {
            "title": f"Result {number} about <strong>{query}</strong>",
            "url": f"https://example.com/{query.replace(' ', '-')}/{number}",
            "description": f"All about <strong>{query}</strong> &amp; more ({number}).",
            "language": "en",
            "family_friendly": True,
            "type": "search_result",
        }
        if number % 2:
            result["age"] = f"{number} days ago"
            result["page_age"] = "2026-09-01T00:00:00"
        results.append(result)
    return {
        "type": "search",
        "query": {"original": query, "more_results_available": False},
        "web": {"type": "search", "results": results, "family_friendly": True},
    }


class BraveSearchDouble:
    """`GET {base_url}/web/search` on 127.0.0.1, recording every request."""

    def __init__(self, key: str = BRAVE_KEY) -> None:
        self.key = key
        self.requests: list[BraveRequest] = []
        self._answers: list[Answer] = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        self.hanging = threading.Event()
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                double._serve(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/res/v1"

    def answer_next(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        """The next request gets this answer (a dict is sent as JSON, bytes as they are)."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        with self._lock:
            self._answers.append(Answer(status, raw, headers or {}))

    def hang_next(self) -> None:
        """The next request gets no answer until the double closes."""
        with self._lock:
            self._answers.append(Answer(200, b"", hang=True))

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        url = urlsplit(handler.path)
        params = {name: values[-1] for name, values in parse_qs(url.query).items()}
        with self._lock:
            self.requests.append(BraveRequest(url.path, params, dict(handler.headers.items())))
            answer = self._answers.pop(0) if self._answers else None
        if answer is None:
            answer = self._search(url.path, params, handler.headers.get("X-Subscription-Token"))
        if answer.hang:
            self.hanging.set()
            self._release.wait()
            return
        handler.send_response(answer.status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(answer.body)))
        for name, value in answer.headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(answer.body)

    def _search(self, path: str, params: dict[str, str], token: str | None) -> Answer:
        if path != SEARCH_PATH:
            return Answer(404, json.dumps(brave_error(404, "NOT_FOUND", path)).encode())
        if token != self.key:
            error = brave_error(
                422, "SUBSCRIPTION_TOKEN_INVALID", "The provided subscription token is invalid."
            )
            return Answer(422, json.dumps(error).encode())
        body = web_results(params["q"], int(params.get("count", "20")))
        return Answer(200, json.dumps(body).encode(), {"X-RateLimit-Remaining": "1, 1999"})

    error_body = staticmethod(brave_error)

    def close(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def brave() -> Iterator[BraveSearchDouble]:
    double = BraveSearchDouble()
    yield double
    double.close()


ServiceFactory = Callable[..., contextlib.AbstractContextManager[str]]


@pytest.fixture
def mcp_service(brave: BraveSearchDouble) -> ServiceFactory:
    """`with mcp_service(**settings) as url:` the MCP service on a free loopback port.

    Settings default to the Brave double and its key; the service is the one
    `kronk server start` and `kronk mcp start` run, without a token check.
    """

    @contextlib.contextmanager
    def start(**overrides: Any) -> Iterator[str]:
        values: dict[str, Any] = {
            "listen": "127.0.0.1:0",
            "braveapikey": brave.key,
            "brave_url": brave.base_url,
            **overrides,
        }
        settings = McpSettings.model_validate(values)
        service = BackgroundService(mcp_app(settings, gate=None), settings.listen)
        service.start()
        try:
            yield f"http://{service.address}"
        finally:
            service.stop()

    return start


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


@pytest.fixture
def raw() -> Iterator[RawFactory]:
    """`raw(url, headers={...})`: a RawSession on a shared HTTP client."""
    with httpx.Client(timeout=30) as http:
        yield lambda url, headers=None: RawSession(http, url, dict(headers or {}))
