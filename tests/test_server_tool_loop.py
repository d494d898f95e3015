"""Server tools (kronk_core.contract.server_tools): the hook that offers them, served to an
agent's built-in web search, and the loop that runs them (kronk_core.tool_loop) from the SDK,
on the scripted model behind the real ChatML template with Hermes calls. The mcp plugin's web
search is tests/test_served_web_search.py's."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import httpx

from kronk_core import ChatMessage, ChatRequest, FinishReason, hookimpl
from kronk_core.contract.server_tools import WEB_SEARCH, ServerTool, ServerToolResult, Source
from kronk_core.contract.types import ChatDelta
from kronk_core.settings.sections import Sectioned
from kronk_core.tool_loop import ServerToolUse, start_tool_loop
from kronk_testing.scripted import Script

if TYPE_CHECKING:
    from kronk_core import Kronk
    from kronk_testing.plugin import MakeServer, ScriptedKronk

MODEL = "tools"
NOON = "It is 12:00 now."
CLOCK_ANSWER = "The clock says noon."
BROKEN_ANSWER = "The clock is broken."


def call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


SCRIPT = Script(
    replies=(
        ("What time is it?", call("clock", {})),
        (NOON, CLOCK_ANSWER),
        ("clock failed", BROKEN_ANSWER),
    ),
    context_length=16384,
)


class Clock:
    """A server tool of the test's: the time, or an exception when `broken`."""

    name = "clock"
    description = "The time of day."
    parameters: Mapping[str, Any] = {"type": "object", "properties": {}}
    max_uses = 2

    def __init__(self, *, broken: bool = False) -> None:
        self.broken = broken
        self.calls: list[Mapping[str, Any]] = []

    async def run(self, arguments: Mapping[str, Any]) -> ServerToolResult:
        self.calls.append(arguments)
        if self.broken:
            raise RuntimeError("the clock's battery is flat")
        return ServerToolResult(NOON)


def tools_kronk(scripted_kronk: ScriptedKronk, script: Script = SCRIPT, **options: Any) -> Kronk:
    settings = {
        "templates": {"template": "chatml", "tool_format": "hermes"},
        "n_seq_max": 1,
        "cache": "imc",
        "draft_strategy": "none",
    }
    return scripted_kronk({MODEL: settings}, script=script, load=MODEL, **options)


def test_hook_kronk_server_tools(scripted_kronk: ScriptedKronk, make_server: MakeServer) -> None:
    class Index:
        """A web search of the plugin's own index."""

        name = WEB_SEARCH
        description = "Searches the local index."
        parameters: Mapping[str, Any] = {
            "type": "object",
            "properties": {"query": {"type": "string"}},
        }
        max_uses = 3

        async def run(self, arguments: Mapping[str, Any]) -> ServerToolResult:
            found = Source(url="https://index.example/tea", title="Tea at the index")
            return ServerToolResult(f"1. {found.title}\n   {found.url}", (found,))

    asked: list[Sectioned] = []

    class OffersATool:
        @hookimpl
        def kronk_server_tools(self, settings: Sectioned) -> Sequence[ServerTool]:
            asked.append(settings)
            return [Index()]

    search = {"name": WEB_SEARCH, "arguments": {"query": "tea"}}
    script = Script(
        replies=(
            ("Find tea.", f"<tool_call>\n{json.dumps(search)}\n</tool_call>"),
            ("Tea at the index", "The index has tea."),
        )
    )
    chatml = {"templates": {"template": "chatml", "tool_format": "hermes"}}
    # The mcp plugin, disabled, offers no web search of its own.
    kronk = scripted_kronk(
        {"m": chatml}, plugins={"index": OffersATool()}, script=script, disabled=["mcp"]
    )
    server = make_server(kronk)
    # The agent's built-in web search is served with the plugin's tool, inside the request.
    body = {"model": "m", "input": "Find tea.", "tools": [{"type": "web_search"}]}
    for _ in range(2):
        response = httpx.post(f"{server.base_url}/v1/responses", json=body, timeout=30)
        assert response.status_code == 200, response.text
        search_call, message = response.json()["output"]
        assert search_call["type"] == "web_search_call"
        assert search_call["action"]["query"] == "tea"
        assert search_call["action"]["sources"] == [
            {"type": "url", "url": "https://index.example/tea"}
        ]
        assert message["content"][0]["text"] == "The index has tea."
    # Asked once per server, with its settings.
    assert asked == [server.app.state.settings]


async def test_the_loop_runs_the_call_and_continues_on_the_cached_prompt(
    scripted_kronk: ScriptedKronk,
) -> None:
    kronk = tools_kronk(scripted_kronk)
    clock = Clock()
    request = ChatRequest(
        messages=(ChatMessage(role="user", content="What time is it?"),), model=MODEL
    )
    loop = await start_tool_loop(kronk, request, [clock])
    events = [event async for event in loop]
    uses = [event for event in events if isinstance(event, ServerToolUse)]
    assert [use.result for use in uses] == [None, ServerToolResult(NOON)]
    assert uses[0].call.name == "clock" and clock.calls == [{}]
    deltas = [event for event in events if isinstance(event, ChatDelta)]
    # The call is the loop's: the caller sees none of its pieces, only the answer after it.
    assert not any(delta.tool_calls or delta.tool_call_deltas for delta in deltas)
    assert "".join(delta.content for delta in deltas) == CLOCK_ANSWER
    final = deltas[-1]
    assert final.finish_reason is FinishReason.stop and final.usage is not None
    assert [turn.role for turn in loop.turns] == ["assistant", "tool"]
    assert loop.turns[0].tool_calls == (uses[0].call,)
    assert loop.turns[1].content == NOON and loop.turns[1].tool_call_id == uses[0].call.id
    assert loop.uses == {"clock": 1}
    # The continuation found the whole first prompt in the slot: only what followed it was
    # prefilled (usage sums both generations; the first one found nothing cached).
    assert final.usage.cached_tokens >= loop.prompt_tokens


async def test_a_tool_that_raises_is_a_failed_call_and_the_model_answers(
    scripted_kronk: ScriptedKronk,
) -> None:
    kronk = tools_kronk(scripted_kronk)
    request = ChatRequest(
        messages=(ChatMessage(role="user", content="What time is it?"),), model=MODEL
    )
    loop = await start_tool_loop(kronk, request, [Clock(broken=True)])
    events = [event async for event in loop]
    results = [event.result for event in events if isinstance(event, ServerToolUse)]
    assert results == [None, ServerToolResult("clock failed", error="unavailable")]
    text = "".join(event.content for event in events if isinstance(event, ChatDelta))
    assert text == BROKEN_ANSWER


async def test_a_model_that_keeps_calling_is_stopped(scripted_kronk: ScriptedKronk) -> None:
    """max_uses 1: the second call is refused, and so is the third, after which the answer
    ends; the client never gets a call it did not offer."""
    # Whatever the result says, the question stays the last trigger: the model calls again.
    stubborn = Script(replies=(("Ask the clock.", call("clock", {})),))
    kronk = tools_kronk(scripted_kronk, stubborn)
    clock = Clock()
    request = ChatRequest(messages=(ChatMessage(role="user", content="Ask the clock."),))
    loop = await start_tool_loop(kronk, request, [clock], max_uses={"clock": 1})
    events = [event async for event in loop]
    results = [event.result for event in events if isinstance(event, ServerToolUse)]
    assert [result and result.error for result in results] == [
        None,
        None,
        None,
        "max_uses_exceeded",
        None,
        "max_uses_exceeded",
    ]
    assert clock.calls == [{}] and loop.uses == {"clock": 1}
    final = events[-1]
    assert isinstance(final, ChatDelta) and final.finish_reason is FinishReason.stop
    assert not any(isinstance(event, ChatDelta) and event.tool_calls for event in events)
