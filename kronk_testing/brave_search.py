"""A local server speaking the Brave Search web search API, for the MCP service's tests.

The Brave Search API cannot be reached from here, so `BraveSearchDouble`
answers `GET /res/v1/web/search` the way Brave does: the key in the
`X-Subscription-Token` header (a wrong one: 422 SUBSCRIPTION_TOKEN_INVALID),
`q`, `count`, `country`, `safesearch` and `freshness` as query parameters,
a WebSearchApiResponse (`web.results[]` with title, url, description and,
for some, age) and ErrorResponse bodies. Tests queue other answers with
`answer_next` and `hang_next`.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

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
