"""The Anthropic dialect without a model: request mapping, event sequences, pings, errors."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from litestar.config.app import AppConfig
from litestar.connection import ASGIConnection
from litestar.testing import TestClient
from pydantic import ValidationError

from kronk_anthropic.answers import ContentBlocks, signature
from kronk_anthropic.errors import ANTHROPIC
from kronk_anthropic.schemas import BLOCK_SEPARATOR, FIELDS, MessagesRequest
from kronk_anthropic.stream import sse
from kronk_api import ServerSettings, create_app
from kronk_api.dialect import keepalive
from kronk_core import Kronk, KronkConfig, hookimpl
from kronk_core.contract.errors import (
    ContextOverflowError,
    EngineClosedError,
    InvalidRequestError,
    KronkError,
    QueueFullError,
)
from kronk_core.contract.media import MEDIA_MARKER
from kronk_core.contract.types import (
    ChatDelta,
    ChatMessage,
    FinishReason,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    Usage,
)

WEATHER = {"name": "get_weather", "input_schema": {"type": "object"}}
USAGE = Usage(prompt_tokens=30, completion_tokens=9, cached_tokens=20, reasoning_tokens=4)
CALL = ToolCall(id="call_abc", name="get_weather", arguments='{"city":"Oslo"}')
DELTAS = [
    ChatDelta(reasoning="Need the "),
    ChatDelta(reasoning="weather."),
    ChatDelta(content="Checking."),
    # A call streams: its name, fragments of its arguments, then the whole call.
    ChatDelta(tool_call_deltas=(ToolCallDelta("call_abc", name="get_weather"),)),
    ChatDelta(tool_call_deltas=(ToolCallDelta("call_abc", arguments='{"city":"Os'),)),
    ChatDelta(tool_call_deltas=(ToolCallDelta("call_abc", arguments='lo"}'),)),
    ChatDelta(tool_calls=(CALL,)),
    ChatDelta(finish_reason=FinishReason.tool_calls, usage=USAGE),
]


def _request(**body: Any) -> MessagesRequest:
    body.setdefault("messages", [{"role": "user", "content": "Hi"}])
    return MessagesRequest.model_validate({"model": "m", "max_tokens": 5, **body})


# ---- request mapping --------------------------------------------------------


def test_conversation_maps_to_core_messages() -> None:
    request = _request(
        system=[{"type": "text", "text": "Be"}, {"type": "text", "text": "brief."}],
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "Weather?", "cache_control": {}}],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Call it.", "signature": "s"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"c": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "timeout"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "Thanks."},
                ],
            },
        ],
    )
    assert request.to_core().messages == (
        ChatMessage(role="system", content="Be\n\nbrief."),
        ChatMessage(role="user", content="Weather?"),
        ChatMessage(
            role="assistant",
            content="Let me look.",
            tool_calls=(ToolCall(id="toolu_1", name="get_weather", arguments='{"c": 1}'),),
            reasoning_content="Call it.",
        ),
        ChatMessage(role="tool", content="Sunny", tool_call_id="toolu_1"),
        ChatMessage(role="tool", content="Error: timeout", tool_call_id="toolu_2"),
        ChatMessage(role="user", content="Thanks."),
    )


def test_parameters_map_to_core_request() -> None:
    core = _request(
        stop_sequences=["END"],
        temperature=0,
        top_k=5,
        metadata={"user_id": "u"},
        tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        thinking={"type": "enabled", "budget_tokens": 2048},
    ).to_core()
    assert core.stop == ("END",)
    assert core.max_tokens == 5
    assert core.sampling is not None
    assert core.sampling.model_dump(exclude_none=True) == {"temperature": 0, "top_k": 5}
    assert core.tools[0].name == "get_weather"
    assert json.loads(core.tools[0].parameters_json) == {"type": "object"}
    assert core.tool_choice == ToolChoice(mode="required")
    assert core.parallel_tool_calls is False
    assert core.enable_thinking is True
    plain = _request().to_core()
    assert plain.enable_thinking is False and plain.parallel_tool_calls is True


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, ToolChoice()),
        ({"type": "none"}, ToolChoice(mode="none")),
        ({"type": "tool", "name": "get_weather"}, ToolChoice(mode="function", name="get_weather")),
    ],
)
def test_tool_choice(choice: dict[str, str], expected: ToolChoice) -> None:
    assert _request(tools=[WEATHER], tool_choice=choice).to_core().tool_choice == expected


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"temperature": 1.5}, "temperature"),
        (
            {"mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "x"}]},
            "mcp_servers: remote MCP servers are not supported",
        ),
        ({"tools": [{"name": "get_weather"}]}, "input_schema"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        (
            {"messages": [{"role": "system", "content": [{"type": "image", "source": {}}]}]},
            "messages.0.content",
        ),
        ({"tool_choice": {"type": "tool"}}, "needs a name"),
        ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages.0.content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]},
            "thinking blocks are not allowed in a user message",
        ),
    ],
)
def test_invalid_requests(body: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _request(**body)


def test_system_messages_among_the_messages_stay_in_place() -> None:
    request = _request(
        system="Rules.",
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "system", "content": "Always shown.", "clear_at": "never"},
            {"role": "assistant", "content": "Hello."},
            {"role": "system", "content": "Gone once answered.", "clear_at": "next_user_message"},
            {"role": "user", "content": "Again?"},
            {
                "role": "system",
                "content": "Shown: no user turn follows.",
                "clear_at": "next_user_message",
            },
        ],
    )
    assert request.to_core().messages == (
        ChatMessage(role="system", content="Rules."),
        ChatMessage(role="user", content="Hi"),
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="system", content="Always shown."),
        ChatMessage(role="assistant", content="Hello."),
        ChatMessage(role="user", content="Again?"),
        ChatMessage(role="system", content="Shown: no user turn follows."),
    )


def test_claude_code_s_fields_map_or_are_ignored() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    request = _request(
        thinking={"type": "adaptive", "display": "omitted"},
        output_config={"effort": "max", "format": {"type": "json_schema", "schema": schema}},
        context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        metadata={"user_id": "{}"},
        cache_control={"type": "ephemeral"},
        frobnicate=1,
        tools=[
            WEATHER,
            {"type": "custom", **WEATHER, "name": "other"},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
            {"type": "bash_20250124", "name": "bash"},
        ],
    )
    core = request.to_core()
    assert core.enable_thinking is True and core.reasoning_effort == "high"
    assert core.json_schema is not None and json.loads(core.json_schema) == schema
    assert [tool.name for tool in core.tools] == ["get_weather", "other"]
    assert request.omitted_tools() == ["web_search_20250305", "bash_20250124"]
    assert FIELDS.unknown(request.model_extra or {}) == ["frobnicate"]
    efforts = {
        effort: _request(output_config={"effort": effort}).to_core().reasoning_effort
        for effort in ("low", "medium", "high", "xhigh")
    }
    assert efforts == {"low": "low", "medium": "medium", "high": "high", "xhigh": "high"}
    legacy = _request(output_format={"type": "json_schema", "schema": schema}).to_core()
    assert legacy.json_schema == core.json_schema


def test_max_tokens_required() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    with pytest.raises(ValidationError, match="max_tokens"):
        MessagesRequest.model_validate(body)


def test_image_blocks_become_media_of_their_message() -> None:
    png = b"\x89PNG\r\n\x1a\n" + bytes(24)
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png).decode()}
    image = {"type": "image", "source": source}
    text = {"type": "text", "text": "Look:"}
    for content, role in (
        ([text, image], "user"),
        ([{"type": "tool_result", "tool_use_id": "t", "content": [text, image]}], "tool"),
    ):
        (message,) = _request(messages=[{"role": "user", "content": content}]).to_core().messages
        assert message.role == role
        assert message.content == "Look:" + BLOCK_SEPARATOR + MEDIA_MARKER
        assert [item.data for item in message.media] == [png]


def test_image_urls_need_a_server_that_fetches() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}
    for content in ([image], [{"type": "tool_result", "tool_use_id": "t", "content": [image]}]):
        request = _request(messages=[{"role": "user", "content": content}])
        with pytest.raises(InvalidRequestError, match="does not fetch image URLs"):
            request.to_core()


# ---- content blocks and events ----------------------------------------------


async def _items(items: Sequence[ChatDelta]) -> AsyncIterator[ChatDelta]:
    for item in items:
        yield item


def _decode(chunks: list[bytes]) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for chunk in chunks:
        name, data = chunk.decode().removesuffix("\n\n").split("\n")
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


async def _stream(items: Sequence[ChatDelta]) -> list[tuple[str, dict[str, Any]]]:
    return _decode([chunk async for chunk in sse("msg_1", "m", 30, _items(items))])


async def test_event_sequence_builds_the_non_streamed_message() -> None:
    events = await _stream(DELTAS)
    assert [
        (name, data.get("index"), data.get("delta", {}).get("type")) for name, data in events
    ] == [
        ("message_start", None, None),
        ("ping", None, None),
        ("content_block_start", 0, None),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, None),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, None),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2][1]["usage"] == {
        "input_tokens": 10,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 20,
        "output_tokens": 9,
        "output_tokens_details": {"thinking_tokens": 4},
    }
    assert events[0][1]["message"]["usage"]["input_tokens"] == 30

    # The SDK's own accumulator rebuilds the same content the non-streamed answer has.
    snapshot = None
    buffers: dict[int, bytes] = {}
    for _, data in events:
        if data["type"] != "ping":
            snapshot = accumulate_event(event=data, current_snapshot=snapshot, json_bufs=buffers)  # type: ignore[arg-type]
    blocks = ContentBlocks()
    for delta in DELTAS:
        blocks.feed(delta)
    blocks.close()
    assert snapshot is not None
    assert [block.model_dump(exclude_none=True) for block in snapshot.content] == blocks.content
    assert blocks.content == [
        {
            "type": "thinking",
            "thinking": "Need the weather.",
            "signature": signature("Need the weather."),
        },
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {"city": "Oslo"}},
    ]
    assert snapshot.stop_reason == "tool_use"
    assert snapshot.usage.cache_read_input_tokens == 20


async def test_stop_sequence_reason() -> None:
    last = ChatDelta(finish_reason=FinishReason.stop, usage=USAGE, stop_sequence="END")
    events = await _stream([ChatDelta(content="a"), last])
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


async def test_error_mid_stream() -> None:
    async def failing() -> AsyncIterator[ChatDelta]:
        yield ChatDelta(content="partial")
        raise EngineClosedError("model unloaded")

    frames = ANTHROPIC.with_stream_errors(sse("msg_1", "m", 30, failing()))
    chunks = [chunk async for chunk in frames]
    name, data = _decode(chunks)[-1]
    assert name == "error"
    assert data["error"]["type"] == "overloaded_error"
    assert data["error"]["message"] == "model unloaded"


async def test_keepalive_pings_during_silence_and_cancels_on_exit() -> None:
    """A silent stream gets Anthropic's ping events between its frames, never inside one."""
    release = asyncio.Event()
    finished = asyncio.Event()

    async def frames() -> AsyncIterator[bytes]:
        try:
            await release.wait()
            yield b"frame\n\n"
            await asyncio.Event().wait()  # silent until the client leaves
        finally:
            finished.set()

    ping = ANTHROPIC.keepalive_frame
    assert _decode([ping]) == [("ping", {"type": "ping"})]
    items = keepalive(frames(), ping, interval=0.01)
    assert [await anext(items), await anext(items)] == [ping, ping]
    release.set()
    seen = await anext(items)
    while seen == ping:  # pings already due when the frame came
        seen = await anext(items)
    assert seen == b"frame\n\n"
    assert await anext(items) == ping
    await items.aclose()
    await asyncio.wait_for(finished.wait(), 10)


# ---- errors -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (409, "invalid_request_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (503, "overloaded_error"),
        (529, "overloaded_error"),
    ],
)
def test_error_types(status: int, kind: str) -> None:
    assert ANTHROPIC.error_type(status) == kind


def test_error_responses() -> None:
    full = ANTHROPIC.error_response(QueueFullError("queue full", retry_after=3))
    assert full.status_code == 429
    assert full.headers["Retry-After"] == "3"
    assert full.content == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "queue full"},
    }
    overflow = ANTHROPIC.error_response(ContextOverflowError("needs 9000 tokens"))
    assert overflow.content["error"]["message"] == "prompt is too long: needs 9000 tokens"
    counted = ContextOverflowError("needs 9000", prompt_tokens=8999, context_window=8192)
    assert ANTHROPIC.error_response(counted).content["error"]["message"] == (
        "prompt is too long: 8999 tokens > 8191 maximum (needs 9000)"
    )
    assert ANTHROPIC.stream_error(KronkError("boom")) == (
        b'event: error\ndata: {"type": "error", "error": {"type": "api_error", '
        b'"message": "internal: the server could not serve this request; see its log"}}\n\n'
    )


# ---- guards ---------------------------------------------------------------------


class Unauthenticated(KronkError):
    status = 401
    code = "unauthenticated"


def _messages_need_a_key(connection: ASGIConnection[Any, Any, Any, Any], handler: Any) -> None:
    if handler.opt.get("kronk_endpoint") == "messages" and "x-api-key" not in connection.headers:
        raise Unauthenticated("no API key")


class GuardPlugin:
    @hookimpl
    def kronk_app(self, app_config: AppConfig) -> None:
        app_config.guards.append(_messages_need_a_key)


def test_guard_errors_come_out_in_anthropic_shape(tmp_path: Path) -> None:
    kronk = Kronk(KronkConfig(base_path=tmp_path), plugins={"guard": GuardPlugin()})
    body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}
    with TestClient(create_app(ServerSettings(), kronk=kronk)) as client:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            response = client.post(path, json=body, headers={"x-request-id": "r1"})
            assert response.status_code == 401
            assert response.json() == {
                "type": "error",
                "error": {"type": "authentication_error", "message": "no API key"},
                "request_id": "r1",
            }
        wrong_method = client.get("/v1/messages", headers={"x-api-key": "k"})
        assert wrong_method.status_code == 405
        assert wrong_method.json()["error"]["type"] == "invalid_request_error"
