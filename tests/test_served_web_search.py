"""Agents' built-in web search, served with Kronk's own (the mcp plugin's web_search server
tool), end to end: the official `openai` (Responses) and `anthropic` (Messages) SDKs against a
real server with the mcp plugin's Brave Search key set, Brave Search being the local double of
kronk_testing.brave_search.

The model is the harness's scripted one behind the real ChatML template with Hermes calls: its
reply to a question is a `web_search` call, and once a result's title is in its prompt its
reply quotes that title, which it can only have read in the search's result.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import openai
import pytest

from kronk_api import ServerSettings
from kronk_api.client_extras import OMITTED_TOOLS_HEADER
from kronk_testing.brave_search import BraveSearchDouble, brave_error
from kronk_testing.scripted import Script

if TYPE_CHECKING:
    from kronk_testing.plugin import MakeServer, ScriptedKronk
    from kronk_testing.server import RunningServer

MODEL = "searcher"
QUESTION = "What is new in llama.cpp?"
QUERY = "llama.cpp news"
TITLE = f"Result 1 about {QUERY}"
FIRST_URL = "https://example.com/llama.cpp-news/1"
ANSWER = f"{TITLE} says it got faster."
# Two searches asked for where one is allowed.
TWO_SEARCHES = "Compare the first and the second thing."
SECOND_QUERY = "second thing"
ONE_SEARCH_ANSWER = "One search was all I had."
UNAVAILABLE_ANSWER = "I could not search the web just now."
# Anthropic's built-in web search, as Claude Code declares it.
ANTHROPIC_WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}


def call(query: str) -> str:
    arguments = {"query": query}
    return (
        "<tool_call>\n"
        + json.dumps({"name": "web_search", "arguments": arguments})
        + ("\n</tool_call>")
    )


SCRIPT = Script(
    replies=(
        (QUESTION, call(QUERY)),
        (TITLE, ANSWER),
        (TWO_SEARCHES, call("first thing")),
        ("Result 1 about first thing", call(SECOND_QUERY)),
        ("at most 1 times", ONE_SEARCH_ANSWER),
        ("rate limit reached", UNAVAILABLE_ANSWER),
        ("cannot reach Brave Search", UNAVAILABLE_ANSWER),
    ),
    default="No search needed.",
    context_length=65536,
)


@pytest.fixture
def brave() -> Iterator[BraveSearchDouble]:
    double = BraveSearchDouble()
    yield double
    double.close()


def searching_server(
    scripted_kronk: ScriptedKronk, make_server: MakeServer, mcp: dict[str, Any]
) -> RunningServer:
    """The scripted model with the Incremental Message Cache, served with `mcp` as the mcp
    plugin's settings."""
    settings = {
        "templates": {"template": "chatml", "tool_format": "hermes"},
        "context_window": 65536,
        "n_seq_max": 1,
        "cache": "imc",
        "draft_strategy": "none",
    }
    kronk = scripted_kronk({MODEL: settings}, script=SCRIPT, load=MODEL)
    return make_server(kronk, ServerSettings(sections={"mcp": mcp}))


@pytest.fixture
def server(
    scripted_kronk: ScriptedKronk, make_server: MakeServer, brave: BraveSearchDouble
) -> RunningServer:
    """Web search enabled: the Brave double's key and URL."""
    mcp = {"braveapikey": brave.key, "brave_url": brave.base_url, "brave_timeout": 30}
    return searching_server(scripted_kronk, make_server, mcp)


@pytest.fixture
def openai_client(server: RunningServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=60
    ) as client:
        yield client


@pytest.fixture
def claude(server: RunningServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(
        base_url=server.base_url, api_key="none", max_retries=0, timeout=60
    ) as client:
        yield client


def queries(brave: BraveSearchDouble) -> list[str]:
    return [request.params["q"] for request in brave.requests]


# ---- Responses ----------------------------------------------------------------------------


def test_responses_gets_the_search_then_the_answer(
    openai_client: openai.OpenAI, brave: BraveSearchDouble
) -> None:
    raw = openai_client.responses.with_raw_response.create(
        model=MODEL, input=QUESTION, tools=[{"type": "web_search"}]
    )
    assert OMITTED_TOOLS_HEADER not in raw.headers
    response = raw.parse()
    assert [item.type for item in response.output] == ["web_search_call", "message"]
    search = response.output[0].model_dump()
    assert search["id"].startswith("ws_") and search["status"] == "completed"
    assert search["action"]["type"] == "search" and search["action"]["query"] == QUERY
    assert search["action"]["sources"][0] == {
        "type": "url",
        "url": f"https://example.com/{QUERY.replace(' ', '-')}/1",
    }
    assert response.output_text == ANSWER
    assert response.status == "completed"
    assert queries(brave) == [QUERY]
    # Both generations' prompts are counted; the second one's reuses the first's.
    assert response.usage is not None
    assert response.usage.input_tokens_details.cached_tokens > response.usage.input_tokens / 3


def test_responses_streams_the_search_s_events(
    openai_client: openai.OpenAI, brave: BraveSearchDouble
) -> None:
    with openai_client.responses.stream(
        model=MODEL, input=QUESTION, tools=[{"type": "web_search_preview"}]
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    names = [event.type for event in events]
    assert [event.sequence_number for event in events] == list(range(1, len(events) + 1))
    search = names.index("response.web_search_call.in_progress")
    assert names[search - 1 : search + 4] == [
        "response.output_item.added",
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.web_search_call.completed",
        "response.output_item.done",
    ]
    added, done = events[search - 1], events[search + 3]
    assert added.item.type == done.item.type == "web_search_call"
    assert done.item.status == "completed"
    # The message comes after the search, and says what the search found.
    assert names.index("response.output_text.delta") > search
    assert names[-1] == "response.completed"
    assert [item.type for item in final.output] == ["web_search_call", "message"]
    assert final.output_text == ANSWER
    assert queries(brave) == [QUERY]


def test_responses_stores_the_search_in_the_conversation(
    openai_client: openai.OpenAI, server: RunningServer
) -> None:
    first = openai_client.responses.create(
        model=MODEL, input=QUESTION, tools=[{"type": "web_search"}]
    )
    follow = openai_client.responses.create(
        model=MODEL, input="Thanks.", previous_response_id=first.id
    )
    # The stored turns hold the result: its title is in the next prompt, so the model
    # answers as to the search.
    assert follow.output_text == ANSWER


# ---- Anthropic Messages -------------------------------------------------------------------


def test_anthropic_gets_the_search_blocks_then_the_answer(
    claude: anthropic.Anthropic, brave: BraveSearchDouble
) -> None:
    raw = claude.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=512,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[ANTHROPIC_WEB_SEARCH],
    )
    assert OMITTED_TOOLS_HEADER not in raw.headers
    message = raw.parse()
    use, result, text = message.content
    assert use.type == "server_tool_use" and use.name == "web_search"
    assert use.id.startswith("srvtoolu_") and use.input == {"query": QUERY}
    assert result.type == "web_search_tool_result" and result.tool_use_id == use.id
    assert isinstance(result.content, list) and len(result.content) == 10
    assert result.content[0].type == "web_search_result"
    assert result.content[0].title == TITLE
    assert result.content[0].url == FIRST_URL
    assert result.content[0].page_age == "1 days ago"
    assert text.type == "text" and text.text == ANSWER
    assert message.stop_reason == "end_turn"
    assert message.usage.server_tool_use is not None
    assert message.usage.server_tool_use.web_search_requests == 1
    assert queries(brave) == [QUERY]
    # count_tokens counts the prompt /v1/messages starts: with web_search offered.
    question: list[Any] = [{"role": "user", "content": QUESTION}]
    offered = claude.messages.count_tokens(
        model=MODEL, messages=question, tools=[ANTHROPIC_WEB_SEARCH]
    )
    plain = claude.messages.count_tokens(model=MODEL, messages=question)
    assert offered.input_tokens > plain.input_tokens + len("web_search")


def test_anthropic_streams_the_search_blocks(
    claude: anthropic.Anthropic, brave: BraveSearchDouble
) -> None:
    with claude.messages.stream(
        model=MODEL,
        max_tokens=512,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[{**ANTHROPIC_WEB_SEARCH, "type": "web_search_20260209"}],
    ) as stream:
        events = list(stream)
        message = stream.get_final_message()
    starts = [event.content_block.type for event in events if event.type == "content_block_start"]
    assert starts == ["server_tool_use", "web_search_tool_result", "text"]
    assert [block.type for block in message.content] == starts
    use = message.content[0]
    assert use.type == "server_tool_use" and use.input == {"query": QUERY}
    assert message.content[2].type == "text" and message.content[2].text == ANSWER
    assert message.usage.server_tool_use is not None
    assert message.usage.server_tool_use.web_search_requests == 1
    assert queries(brave) == [QUERY]


def test_anthropic_takes_the_search_blocks_back_in_the_next_turn(
    claude: anthropic.Anthropic,
) -> None:
    """The next turn as Claude Code sends it: the assistant's blocks as they came."""
    first = claude.messages.create(
        model=MODEL,
        max_tokens=512,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[ANTHROPIC_WEB_SEARCH],
    )
    history: list[Any] = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {"role": "user", "content": "Thanks."},
    ]
    follow = claude.messages.create(
        model=MODEL,
        max_tokens=512,
        messages=history,
        tools=[ANTHROPIC_WEB_SEARCH],
    )
    # The result's title is in the prompt again, rebuilt from the block.
    assert follow.content[-1].type == "text" and follow.content[-1].text == ANSWER


def test_max_uses_is_honoured(claude: anthropic.Anthropic, brave: BraveSearchDouble) -> None:
    """One search allowed: the second call is answered with max_uses_exceeded, unsent."""
    message = claude.messages.create(
        model=MODEL,
        max_tokens=512,
        messages=[{"role": "user", "content": TWO_SEARCHES}],
        tools=[{**ANTHROPIC_WEB_SEARCH, "max_uses": 1}],
    )
    kinds = [block.type for block in message.content]
    assert kinds == [
        "server_tool_use",
        "web_search_tool_result",
        "server_tool_use",
        "web_search_tool_result",
        "text",
    ]
    refused = message.content[3]
    assert refused.type == "web_search_tool_result"
    assert not isinstance(refused.content, list)
    assert refused.content.error_code == "max_uses_exceeded"
    assert message.content[4].type == "text" and message.content[4].text == ONE_SEARCH_ANSWER
    assert queries(brave) == ["first thing"]
    assert message.usage.server_tool_use is not None
    assert message.usage.server_tool_use.web_search_requests == 1


def test_max_tool_calls_is_honoured(openai_client: openai.OpenAI, brave: BraveSearchDouble) -> None:
    response = openai_client.responses.create(
        model=MODEL, input=TWO_SEARCHES, tools=[{"type": "web_search"}], max_tool_calls=1
    )
    searches = [item.model_dump() for item in response.output if item.type == "web_search_call"]
    assert [search["status"] for search in searches] == ["completed", "failed"]
    assert [search["action"]["query"] for search in searches] == ["first thing", SECOND_QUERY]
    assert response.output_text == ONE_SEARCH_ANSWER
    assert queries(brave) == ["first thing"]


# ---- failures, and what is not served -----------------------------------------------------


def test_a_failing_search_gives_an_answer(
    openai_client: openai.OpenAI, claude: anthropic.Anthropic, brave: BraveSearchDouble
) -> None:
    """Brave rate-limited: the model reads why and answers without results, never a 500."""
    limited = brave_error(429, "RATE_LIMITED", "Request rate limit exceeded.")
    brave.answer_next(429, limited, {"Retry-After": "17"})
    response = openai_client.responses.create(
        model=MODEL, input=QUESTION, tools=[{"type": "web_search"}]
    )
    search = response.output[0].model_dump()
    assert search["type"] == "web_search_call" and search["status"] == "failed"
    assert response.output_text == UNAVAILABLE_ANSWER

    brave.answer_next(429, limited, {"Retry-After": "17"})
    message = claude.messages.create(
        model=MODEL,
        max_tokens=512,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[ANTHROPIC_WEB_SEARCH],
    )
    result = message.content[1]
    assert result.type == "web_search_tool_result" and not isinstance(result.content, list)
    assert result.content.error_code == "too_many_requests"
    assert message.content[2].type == "text" and message.content[2].text == UNAVAILABLE_ANSWER
    assert queries(brave) == [QUERY, QUERY]


def test_an_unreachable_search_gives_an_answer(
    scripted_kronk: ScriptedKronk, make_server: MakeServer, port_finder: Any
) -> None:
    """Brave down (nothing listens at its URL): an answer, the search marked failed."""
    down = f"http://127.0.0.1:{port_finder()}/res/v1"
    server = searching_server(scripted_kronk, make_server, {"braveapikey": "k", "brave_url": down})
    body = {"model": MODEL, "input": QUESTION, "tools": [{"type": "web_search"}]}
    response = httpx.post(f"{server.base_url}/v1/responses", json=body, timeout=60)
    assert response.status_code == 200, response.text
    output = response.json()["output"]
    assert [item["type"] for item in output] == ["web_search_call", "message"]
    assert output[0]["status"] == "failed"
    assert output[1]["content"][0]["text"] == UNAVAILABLE_ANSWER


def test_without_a_key_web_search_is_left_out(
    scripted_kronk: ScriptedKronk, make_server: MakeServer
) -> None:
    server = searching_server(scripted_kronk, make_server, {})
    body = {"model": MODEL, "input": QUESTION, "tools": [{"type": "web_search"}]}
    response = httpx.post(f"{server.base_url}/v1/responses", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers[OMITTED_TOOLS_HEADER] == "web_search"
    # Not offered, not run: the model's answer is its call's text.
    assert [item["type"] for item in response.json()["output"]] == ["message"]

    anthropic_body = {
        "model": MODEL,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": [ANTHROPIC_WEB_SEARCH],
    }
    response = httpx.post(f"{server.base_url}/v1/messages", json=anthropic_body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers[OMITTED_TOOLS_HEADER] == "web_search_20250305"


def test_a_web_search_kronk_cannot_honour_is_left_out(
    server: RunningServer, brave: BraveSearchDouble
) -> None:
    """Cached results only (Codex's external_web_access false) or some domains only: Kronk's
    search cannot do that, so the tool is left out as before."""
    for tool in (
        {"type": "web_search", "external_web_access": False},
        {"type": "web_search", "filters": {"allowed_domains": ["example.org"]}},
    ):
        body = {"model": MODEL, "input": "Hi", "tools": [tool]}
        response = httpx.post(f"{server.base_url}/v1/responses", json=body, timeout=60)
        assert response.status_code == 200, response.text
        assert response.headers[OMITTED_TOOLS_HEADER] == "web_search"
    anthropic_body = {
        "model": MODEL,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": [{**ANTHROPIC_WEB_SEARCH, "blocked_domains": ["example.org"]}],
    }
    response = httpx.post(f"{server.base_url}/v1/messages", json=anthropic_body, timeout=60)
    assert response.headers[OMITTED_TOOLS_HEADER] == "web_search_20250305"
    assert brave.requests == []
