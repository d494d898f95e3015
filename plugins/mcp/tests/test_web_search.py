"""The MCP service over Streamable HTTP, driven by the official MCP client and by plain HTTP.

Brave Search is the local double of kronk_testing.brave_search; everything else is real: the
service on uvicorn, the SDK's transport and sessions, the client.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import httpx
import mcp_types as types
import pytest
from mcp import Client

if TYPE_CHECKING:
    from kronk_testing.brave_search import BraveSearchDouble
    from kronk_testing.mcp_session import RawFactory, ServiceFactory


def text(result: types.CallToolResult) -> str:
    return "\n".join(part.text for part in result.content if isinstance(part, types.TextContent))


async def call(url: str, arguments: dict[str, Any]) -> types.CallToolResult:
    async with Client(url, mode="legacy") as client:
        return await client.call_tool("web_search", arguments)


def test_initialize_gives_a_session_that_lists_and_calls_the_tool(
    mcp_service: ServiceFactory, brave: BraveSearchDouble, raw: RawFactory
) -> None:
    with mcp_service() as url:
        session = raw(url)
        response = session.initialize()
        assert response.status_code == 200, response.text
        assert len(session.session_id or "") >= 16
        tools = session.result("tools/list")["tools"]
        assert [tool["name"] for tool in tools] == ["web_search"]
        schema = tools[0]["inputSchema"]
        assert schema["required"] == ["query"]
        assert set(schema["properties"]) == {"query", "count", "country", "freshness", "safesearch"}
        assert schema["properties"]["count"]["maximum"] == 20
        result = session.result("tools/call", {"name": "web_search", "arguments": {"query": "kv"}})
        assert not result.get("isError")
        assert result["structuredContent"]["results"][0]["url"] == "https://example.com/kv/1"
        assert len(brave.requests) == 1


def test_web_search_maps_its_arguments_and_returns_the_results(
    mcp_service: ServiceFactory, brave: BraveSearchDouble
) -> None:
    with mcp_service() as url:
        arguments = {
            "query": "llama.cpp server",
            "count": 3,
            "country": "de",
            "freshness": "pw",
            "safesearch": "strict",
        }
        result = asyncio.run(call(url, arguments))
    assert not result.is_error, text(result)
    [request] = brave.requests
    assert request.path == "/res/v1/web/search"
    assert request.headers["X-Subscription-Token"] == brave.key
    assert request.params == {
        "q": "llama.cpp server",
        "count": "3",
        "country": "DE",
        "freshness": "pw",
        "safesearch": "strict",
    }
    assert result.structured_content == {
        "query": "llama.cpp server",
        "results": [
            {
                "title": f"Result {n} about llama.cpp server",
                "url": f"https://example.com/llama.cpp-server/{n}",
                "description": f"All about llama.cpp server & more ({n}).",
                "age": f"{n} days ago" if n % 2 else None,
            }
            for n in (1, 2, 3)
        ],
    }
    shown = text(result)
    assert "1. Result 1 about llama.cpp server" in shown
    assert "https://example.com/llama.cpp-server/2" in shown
    assert "Age: 3 days ago" in shown and "Age: 2" not in shown
    assert "<strong>" not in shown


def test_defaults_are_ten_results_and_moderate_safesearch(
    mcp_service: ServiceFactory, brave: BraveSearchDouble
) -> None:
    with mcp_service() as url:
        result = asyncio.run(call(url, {"query": "gguf"}))
    assert len(result.structured_content["results"]) == 10  # type: ignore[index]
    assert brave.requests[0].params == {"q": "gguf", "count": "10", "safesearch": "moderate"}


def test_no_results_is_an_answer_not_an_error(
    mcp_service: ServiceFactory, brave: BraveSearchDouble
) -> None:
    brave.answer_next(200, {"type": "search", "query": {"original": "zzqx"}})
    with mcp_service() as url:
        result = asyncio.run(call(url, {"query": "zzqx"}))
    assert not result.is_error
    assert result.structured_content == {"query": "zzqx", "results": []}
    assert text(result) == "No web results for 'zzqx'."


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"query": "x", "count": 0}, "invalid argument 'count': expected an integer from 1 to 20"),
        ({"query": "x", "count": 21}, "invalid argument 'count'"),
        ({"query": "x", "count": True}, "invalid argument 'count'"),
        ({"query": "x", "count": "many"}, "invalid argument 'count'"),
        ({"query": "x", "freshness": "week"}, "invalid argument 'freshness': expected one of pd"),
        ({"query": "x", "freshness": "PD"}, "invalid argument 'freshness'"),
        ({"query": "x", "safesearch": "high"}, "invalid argument 'safesearch'"),
        ({"query": "x", "country": "USA"}, "invalid argument 'country'"),
        ({"query": "   "}, "invalid argument 'query'"),
        ({"query": "q" * 401}, "invalid argument 'query'"),
        ({"query": " ".join(["w"] * 51)}, "invalid argument 'query'"),
        ({"query": 42}, "invalid argument 'query'"),
        ({"count": 5}, "missing argument 'query'"),
        ({"query": "x", "page": 2}, "unknown argument 'page'"),
    ],
)
def test_bad_arguments_are_a_tool_error_and_no_call_out(
    mcp_service: ServiceFactory,
    brave: BraveSearchDouble,
    arguments: dict[str, Any],
    named: str,
) -> None:
    with mcp_service() as url:
        result = asyncio.run(call(url, arguments))
    assert result.is_error
    assert named in text(result), text(result)
    assert result.structured_content == {"error": "invalid_argument", "message": text(result)}
    assert brave.requests == []


def test_without_a_key_the_tool_lists_and_says_how_to_set_one(
    mcp_service: ServiceFactory, brave: BraveSearchDouble
) -> None:
    async def use(url: str) -> tuple[list[str], types.CallToolResult]:
        async with Client(url, mode="legacy") as client:
            tools = await client.list_tools()
            return [tool.name for tool in tools.tools], await client.call_tool(
                "web_search", {"query": "x"}
            )

    with mcp_service(braveapikey=None) as url:
        names, result = asyncio.run(use(url))
    assert names == ["web_search"]
    assert result.is_error
    assert "KRONK_MCP_BRAVEAPIKEY" in text(result) and "MCP_MCP_BRAVEAPIKEY" in text(result)
    assert brave.requests == []


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (422, None),  # what Brave answers a wrong key: SUBSCRIPTION_TOKEN_INVALID
        (401, {"type": "ErrorResponse", "error": {"code": "UNAUTHORIZED", "detail": "no"}}),
        (403, b"forbidden"),
    ],
)
def test_a_refused_key_is_a_tool_error_that_names_the_setting(
    mcp_service: ServiceFactory, brave: BraveSearchDouble, status: int, body: Any
) -> None:
    if body is not None:
        brave.answer_next(status, body)
    key = "BSA-wrong-key-0042" if body is None else brave.key
    with mcp_service(braveapikey=key) as url:
        result = asyncio.run(call(url, {"query": "x"}))
    assert result.is_error
    assert f"Brave Search refused the API key (HTTP {status}" in text(result)
    assert "KRONK_MCP_BRAVEAPIKEY" in text(result)
    assert key not in text(result)


def test_the_key_is_never_repeated_even_when_upstream_echoes_it(
    mcp_service: ServiceFactory, brave: BraveSearchDouble, caplog: pytest.LogCaptureFixture
) -> None:
    detail = f"token {brave.key} has no plan"
    brave.answer_next(402, brave.error_body(402, "SUBSCRIPTION_NOT_FOUND", detail))
    caplog.set_level(logging.INFO)  # the server's default level
    with mcp_service() as url:
        failed = asyncio.run(call(url, {"query": "private words"}))
        found = asyncio.run(call(url, {"query": "private words"}))
    assert failed.is_error and "has no plan" in text(failed)
    assert not found.is_error
    for shown in (text(failed), text(found), str(failed.structured_content)):
        assert brave.key not in shown
    client = ("mcp.client", "httpx2", "httpcore2")  # this test's own MCP client
    logged = "\n".join(
        record.getMessage() for record in caplog.records if not record.name.startswith(client)
    )
    assert "web_search" in logged
    assert brave.key not in logged
    assert "private" not in logged  # not even httpx's request line carries the query


def test_rate_limit_passes_retry_after_on(
    mcp_service: ServiceFactory, brave: BraveSearchDouble
) -> None:
    limited = brave.error_body(429, "RATE_LIMITED", "Request rate limit exceeded for plan.")
    brave.answer_next(429, limited, {"Retry-After": "17"})
    brave.answer_next(429, limited, {"X-RateLimit-Reset": "3, 1419704"})
    with mcp_service() as url:
        first = asyncio.run(call(url, {"query": "x"}))
        second = asyncio.run(call(url, {"query": "x"}))
    assert first.is_error
    assert "rate limit reached (HTTP 429, RATE_LIMITED" in text(first)
    assert "retry after 17 s" in text(first)
    assert first.structured_content is not None
    assert first.structured_content["retry_after"] == 17
    assert first.structured_content["error"] == "rate_limited"
    assert second.structured_content is not None
    assert second.structured_content["retry_after"] == 3


def test_a_silent_upstream_times_out_and_the_session_goes_on(
    mcp_service: ServiceFactory, brave: BraveSearchDouble
) -> None:
    brave.hang_next()

    async def two_calls(url: str) -> tuple[types.CallToolResult, types.CallToolResult]:
        async with Client(url, mode="legacy") as client:
            late = await client.call_tool("web_search", {"query": "x"})
            return late, await client.call_tool("web_search", {"query": "y"})

    # Long enough for the next call's new connection on a loaded machine, short for a test.
    with mcp_service(brave_timeout="2s") as url:
        late, next_one = asyncio.run(two_calls(url))
    assert brave.hanging.is_set()
    assert late.is_error
    assert text(late) == "Brave Search did not answer within 2 s (mcp.brave_timeout)"
    assert not next_one.is_error


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"<html>gateway</html>", "(malformed JSON)"),
        (b'{"web": {"results": [{"title": "no url"}]}}', "(web.results.0.url: Field required)"),
        (b'{"web": {"results": "none"}}', "(web.results: Input should be a valid array)"),
    ],
)
def test_malformed_upstream_json_is_a_tool_error(
    mcp_service: ServiceFactory, brave: BraveSearchDouble, body: bytes, why: str
) -> None:
    brave.answer_next(200, body)
    with mcp_service() as url:
        result = asyncio.run(call(url, {"query": "x"}))
    assert result.is_error
    assert text(result) == f"Brave Search answered with a malformed web search response {why}"


def test_upstream_failure_and_unreachable_upstream_are_tool_errors(
    mcp_service: ServiceFactory, brave: BraveSearchDouble
) -> None:
    brave.answer_next(503, brave.error_body(503, "UNAVAILABLE", "maintenance"))
    with mcp_service() as url:
        failed = asyncio.run(call(url, {"query": "x"}))
    assert text(failed) == "Brave Search failed (HTTP 503, UNAVAILABLE: maintenance)"
    closed = brave.base_url
    brave.close()
    with mcp_service(brave_url=closed) as url:
        unreachable = asyncio.run(call(url, {"query": "x"}))
    assert unreachable.is_error
    assert text(unreachable).startswith("cannot reach Brave Search at http://127.0.0.1:")


def test_an_unknown_tool_is_a_protocol_error(mcp_service: ServiceFactory, raw: RawFactory) -> None:
    with mcp_service() as url:
        session = raw(url)
        session.initialize()
        answer = session.answer(session.call("tools/call", {"name": "fetch_page", "arguments": {}}))
    assert answer["error"]["code"] == types.INVALID_PARAMS
    assert answer["error"]["message"] == "unknown tool 'fetch_page'; this service has web_search"


def test_several_sessions_at_once(
    mcp_service: ServiceFactory, brave: BraveSearchDouble, raw: RawFactory
) -> None:
    queries = [f"topic {n}" for n in range(6)]

    async def session(url: str, query: str) -> tuple[list[str], types.CallToolResult]:
        async with Client(url, mode="legacy") as client:
            tools = await client.list_tools()
            result = await client.call_tool("web_search", {"query": query, "count": 2})
            return [tool.name for tool in tools.tools], result

    async def all_at_once(url: str) -> list[tuple[list[str], types.CallToolResult]]:
        return await asyncio.gather(*(session(url, query) for query in queries))

    with mcp_service() as url:
        answers = asyncio.run(all_at_once(url))
        # Sessions are kept apart: each has its own id, and closing one leaves the others.
        sessions = [raw(url) for _ in range(3)]
        for each in sessions:
            each.initialize()
        ids = {each.session_id for each in sessions}
        closed = httpx.delete(url, headers={"Mcp-Session-Id": sessions[0].session_id or ""})
        after_close = sessions[0].call("tools/list")
        still_open = sessions[1].result("tools/list")
    for query, (names, result) in zip(queries, answers, strict=True):
        assert names == ["web_search"]
        assert not result.is_error
        assert result.structured_content is not None
        assert result.structured_content["query"] == query
        urls = [r["url"] for r in result.structured_content["results"]]
        assert urls == [f"https://example.com/{query.replace(' ', '-')}/{n}" for n in (1, 2)]
    assert sorted(r.params["q"] for r in brave.requests) == sorted(queries)
    assert len(ids) == 3
    assert closed.status_code == 200
    assert after_close.status_code == 404
    assert [tool["name"] for tool in still_open["tools"]] == ["web_search"]


def test_the_2026_protocol_without_sessions_is_served_too(
    mcp_service: ServiceFactory, brave: BraveSearchDouble
) -> None:
    async def use(url: str) -> tuple[str, types.CallToolResult]:
        async with Client(f"{url}/mcp", mode="auto") as client:
            return client.protocol_version, await client.call_tool("web_search", {"query": "x"})

    with mcp_service() as url:
        version, result = asyncio.run(use(url))
    assert version == "2026-07-28"
    assert not result.is_error
