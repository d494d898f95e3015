"""Brave Search's web endpoint: the request web_search makes and the answer it reads."""

from __future__ import annotations

import email.utils
import html
import logging
import math
import re
import time
from dataclasses import dataclass

import anyio
import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

log = logging.getLogger(__name__)

TOKEN_HEADER = "X-Subscription-Token"
_HIGHLIGHT = re.compile(r"</?strong>")
_DETAIL_CHARS = 300


@dataclass(frozen=True)
class SearchQuery:
    """One web search, with arguments already checked."""

    query: str
    count: int
    safesearch: str
    country: str | None = None
    freshness: str | None = None

    def params(self) -> dict[str, str | int]:
        params: dict[str, str | int] = {
            "q": self.query,
            "count": self.count,
            "safesearch": self.safesearch,
        }
        if self.country is not None:
            params["country"] = self.country
        if self.freshness is not None:
            params["freshness"] = self.freshness
        return params


@dataclass(frozen=True)
class WebResult:
    title: str
    url: str
    description: str
    age: str | None


class SearchError(Exception):
    """A search that failed upstream; `message` says why in words an operator can act on."""

    def __init__(self, message: str, *, code: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.retry_after = retry_after


# Brave's answer (WebSearchApiResponse), as far as web_search reads it.
class _Result(BaseModel):
    model_config = ConfigDict(extra="ignore")

    title: str
    url: str
    description: str = ""
    age: str | None = None


class _Web(BaseModel):
    model_config = ConfigDict(extra="ignore")

    results: list[_Result] = []


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")

    # Brave leaves `web` out when nothing matched.
    web: _Web | None = None


class _ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="ignore")

    code: str = ""
    detail: str = ""


class _ErrorAnswer(BaseModel):
    """Brave's ErrorResponse: one `error`, or (in its reference pages) a list of `errors`."""

    model_config = ConfigDict(extra="ignore")

    error: _ErrorDetail | None = None
    errors: list[_ErrorDetail] = []

    def first(self) -> _ErrorDetail | None:
        return self.error or next(iter(self.errors), None)


class HideSearchTerms(logging.Filter):
    """httpx logs each request's URL at info level; a search's query string is the user's words."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) > 1 and isinstance(args[1], httpx.URL):
            url = args[1]
            if url.path.endswith("/web/search") and url.query:
                record.args = (args[0], url.copy_with(query=None), *args[2:])
        return True


# One instance, so adding it again is a no-op (Logger.addFilter skips a filter it has).
HIDE_SEARCH_TERMS = HideSearchTerms()


def _plain(text: str) -> str:
    """Brave marks the query's words with <strong> and escapes HTML entities."""
    return html.unescape(_HIGHLIGHT.sub("", text))


class BraveSearch:
    """Calls `GET {base_url}/web/search` with the key in the subscription-token header.

    The key goes into that header only: never into a message, a log line or a result.
    """

    def __init__(
        self, api_key: str, base_url: str, timeout: float, client: httpx.AsyncClient
    ) -> None:
        self._key = api_key
        self._endpoint = f"{base_url}/web/search"
        self._timeout = timeout
        self._client = client
        logging.getLogger("httpx").addFilter(HIDE_SEARCH_TERMS)

    async def search(self, query: SearchQuery) -> list[WebResult]:
        headers = {TOKEN_HEADER: self._key, "Accept": "application/json"}
        try:
            with anyio.fail_after(self._timeout):
                response = await self._client.get(
                    self._endpoint, params=query.params(), headers=headers
                )
        except TimeoutError:
            raise SearchError(
                f"Brave Search did not answer within {self._timeout:g} s (mcp.brave_timeout)",
                code="timeout",
            ) from None
        except httpx.HTTPError as exc:
            raise SearchError(
                f"cannot reach Brave Search at {self._endpoint} ({type(exc).__name__})",
                code="unreachable",
            ) from None
        if response.status_code != 200:
            raise self._refusal(response)
        return self._results(response)

    def _refusal(self, response: httpx.Response) -> SearchError:
        status = response.status_code
        error = self._error_detail(response)
        said = f"HTTP {status}" + (f", {error.code}: {error.detail}" if error else "")
        said = said[:_DETAIL_CHARS]
        if status in (401, 403) or (error is not None and "TOKEN_INVALID" in error.code):
            return SearchError(
                f"Brave Search refused the API key ({said}); check mcp.braveapikey "
                "(KRONK_MCP_BRAVEAPIKEY, or MCP_MCP_BRAVEAPIKEY for the standalone service)",
                code="bad_api_key",
            )
        if status == 429:
            retry_after = _retry_after(response.headers)
            return SearchError(
                f"Brave Search rate limit reached ({said}); retry after {retry_after} s",
                code="rate_limited",
                retry_after=retry_after,
            )
        return SearchError(f"Brave Search failed ({said})", code="upstream_error")

    def _error_detail(self, response: httpx.Response) -> _ErrorDetail | None:
        try:
            error = _ErrorAnswer.model_validate_json(response.content).first()
        except ValidationError:
            return None
        if error is not None:  # never repeat the key, whatever the upstream echoes
            error.detail = error.detail.replace(self._key, "[key]")
            error.code = error.code.replace(self._key, "[key]")
        return error

    def _results(self, response: httpx.Response) -> list[WebResult]:
        try:
            answer = _Answer.model_validate_json(response.content)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            why = f"{where}: {first['msg']}"
            if first["type"] == "json_invalid":
                why = "malformed JSON"
            raise SearchError(
                f"Brave Search answered with a malformed web search response ({why})",
                code="malformed_response",
            ) from None
        web = answer.web.results if answer.web else []
        return [
            WebResult(
                title=_plain(result.title),
                url=result.url,
                description=_plain(result.description),
                age=result.age,
            )
            for result in web
        ]


def _retry_after(headers: httpx.Headers) -> int:
    """Seconds to wait: Retry-After (seconds or a date), else Brave's X-RateLimit-Reset.

    X-RateLimit-Reset lists one reset per limit (`1, 1419704`: the per-second and
    the monthly one); the first that has run out is what the caller waits for,
    which Brave does not say, so the shortest is passed on.
    """
    value = headers.get("retry-after", "").strip()
    if value.isdigit():
        return max(1, int(value))
    if value:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            when = None
        if when is not None:
            return max(1, math.ceil(when.timestamp() - time.time()))
    resets = [part.strip() for part in headers.get("x-ratelimit-reset", "").split(",")]
    seconds = [int(part) for part in resets if part.isdigit()]
    return max(1, min(seconds)) if seconds else 1
