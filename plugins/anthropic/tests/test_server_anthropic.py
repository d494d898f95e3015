"""The Anthropic dialect against a real server, through the official `anthropic` SDK and httpx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import (
    ImageBlockParam,
    Message,
    MessageParam,
    ToolChoiceAnyParam,
    ToolChoiceParam,
    ToolChoiceToolParam,
    ToolParam,
    ToolResultBlockParam,
    ToolUseBlock,
)

from kronk_llamacpp.packaged import GEMMA_MODEL_ID
from kronk_testing.tool_results import MORE, tokens_of_more

MODEL = GEMMA_MODEL_ID
PROMPT = "Tell me about cats."
MAX_TOKENS = 8
WEATHER: ToolParam = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
# One call: allowed to go on, the base model repeats calls until max_tokens.
FORCE_WEATHER: ToolChoiceToolParam = {
    "type": "tool",
    "name": "get_weather",
    "disable_parallel_tool_use": True,
}
FORCE_ANY: ToolChoiceAnyParam = {"type": "any", "disable_parallel_tool_use": True}
# anthropic 2.x no longer has sampling parameters in its signatures; the API still takes them.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def client(server: Any) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(
        base_url=server.base_url, api_key="x", max_retries=0, timeout=120
    ) as instance:
        yield instance


def _ask(
    client: anthropic.Anthropic,
    prompt: str = PROMPT,
    *,
    model: str = MODEL,
    max_tokens: int = MAX_TOKENS,
    stop_sequences: list[str] | None = None,
) -> Message:
    return client.messages.create(
        model=model,
        max_tokens=max_tokens,
        messages=[{"role": "user", "content": prompt}],
        stop_sequences=stop_sequences or anthropic.omit,
        extra_body=GREEDY,
    )


@pytest.fixture(scope="module")
def greedy(client: anthropic.Anthropic) -> Message:
    """One greedy non-streamed answer to PROMPT, shared by the tests that compare with it."""
    return _ask(client)


def _text(message: Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def test_non_streaming(greedy: Message) -> None:
    assert greedy.id.startswith("msg_")
    assert greedy.type == "message"
    assert greedy.role == "assistant"
    assert greedy.model == MODEL
    assert [block.type for block in greedy.content] == ["text"]
    assert _text(greedy)
    assert greedy.stop_reason in ("end_turn", "max_tokens")
    assert greedy.stop_sequence is None
    usage = greedy.usage
    assert usage.input_tokens > 0
    assert 0 < usage.output_tokens <= MAX_TOKENS
    assert usage.cache_read_input_tokens == 0
    assert usage.cache_creation_input_tokens == 0


def test_stream_matches_non_streaming(client: anthropic.Anthropic, greedy: Message) -> None:
    with client.messages.stream(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=MAX_TOKENS,
        extra_body=GREEDY,
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == _text(greedy)
    assert final.id.startswith("msg_") and final.id != greedy.id
    assert final.model_dump(exclude={"id"}) == greedy.model_dump(exclude={"id"})


def _sse(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    name = ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            events.append((name, json.loads(line.removeprefix("data: "))))
    return events


def test_raw_event_order(server: Any) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
    }
    headers = {"anthropic-version": "2023-06-01", "x-api-key": "x"}
    with httpx.stream(
        "POST", server.base_url + "/v1/messages", json=body, headers=headers, timeout=120
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _sse(response)
    names = [name for name, _ in events]
    assert all(name == data["type"] for name, data in events)
    deltas = names.count("content_block_delta")
    assert deltas >= 1
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] > 0 and start["usage"]["output_tokens"] == 0
    assert events[2][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    assert all(data["delta"]["type"] == "text_delta" for _, data in events[3 : 3 + deltas])
    message_delta = events[-2][1]
    assert message_delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert message_delta["usage"]["output_tokens"] == 4


def test_max_tokens(client: anthropic.Anthropic) -> None:
    message = _ask(client, "hello", max_tokens=3)
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 3


def test_stop_sequences(client: anthropic.Anthropic, greedy: Message) -> None:
    full = _text(greedy)
    stop = full[len(full) // 2 :][:3]
    assert stop.strip(), full
    message = _ask(client, stop_sequences=["\x00never\x00", stop])
    assert message.stop_reason == "stop_sequence"
    assert message.stop_sequence == stop
    assert _text(message) == full[: full.index(stop)]


@pytest.mark.parametrize("stop_sequences", [[""], ["END", ""]], ids=["alone", "among_others"])
def test_empty_stop_sequence_is_400_naming_the_field(
    client: anthropic.Anthropic, stop_sequences: list[str]
) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        _ask(client, stop_sequences=stop_sequences)
    error = caught.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("stop_sequences"), error


QUESTION = "Write a JSON object with a name and an age."
PREFILL = '{"name": "'
# The default model's template (Gemma 3): the generation prompt, then the prefilled text.
CONTINUED_PROMPT = (
    f"<bos><start_of_turn>user\n{QUESTION}<end_of_turn>\n<start_of_turn>model\n{PREFILL}"
)


def _prefilled(*content: Any) -> list[MessageParam]:
    return [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": list(content) or PREFILL},
    ]


def test_a_final_assistant_message_is_a_prefill(client: anthropic.Anthropic, server: Any) -> None:
    tokenized = httpx.post(
        server.base_url + "/v1/tokenize",
        json={"model": MODEL, "input": CONTINUED_PROMPT},
        timeout=30,
    )
    assert tokenized.status_code == 200, tokenized.text
    expected = tokenized.json()["tokens"]
    message = client.messages.create(
        model=MODEL, max_tokens=MAX_TOKENS, messages=_prefilled(), extra_body=GREEDY
    )
    usage = message.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == expected
    text = _text(message)
    assert text and not text.startswith(PREFILL)  # the answer continues the prefill
    counted = client.messages.count_tokens(model=MODEL, messages=_prefilled())
    assert counted.input_tokens == expected
    with client.messages.stream(
        model=MODEL, max_tokens=MAX_TOKENS, messages=_prefilled(), extra_body=GREEDY
    ) as stream:
        assert "".join(stream.text_stream) == text


@pytest.mark.parametrize(
    ("messages", "extra", "error"),
    [
        (
            _prefilled({"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}),
            {},
            "tool calls cannot be continued",
        ),
        (
            _prefilled(),
            {"thinking": {"type": "enabled", "budget_tokens": 1024}},
            "cannot be combined with thinking",
        ),
    ],
    ids=["tool_use", "thinking"],
)
def test_a_prefill_that_cannot_be_continued_is_400(
    client: anthropic.Anthropic, messages: list[MessageParam], extra: dict[str, Any], error: str
) -> None:
    with pytest.raises(anthropic.BadRequestError, match=error) as caught:
        client.messages.create(
            model=MODEL, max_tokens=1, messages=messages, tools=[WEATHER], extra_body=extra
        )
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


def test_count_tokens(client: anthropic.Anthropic, greedy: Message) -> None:
    counted = client.messages.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}]
    )
    usage = greedy.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)


def test_system_prompt_counts(client: anthropic.Anthropic) -> None:
    messages: list[MessageParam] = [{"role": "user", "content": PROMPT}]
    plain = client.messages.count_tokens(model=MODEL, messages=messages)
    as_text = client.messages.count_tokens(model=MODEL, messages=messages, system="Be brief.")
    as_blocks = client.messages.count_tokens(
        model=MODEL, messages=messages, system=[{"type": "text", "text": "Be brief."}]
    )
    assert as_text.input_tokens == as_blocks.input_tokens > plain.input_tokens


def test_missing_max_tokens(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model=MODEL,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=anthropic.omit,  # type: ignore[call-overload]
        )
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    assert body["request_id"] == caught.value.response.headers["x-request-id"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tokens", "4"), ("max_tokens", 4.0), ("temperature", "0.5"), ("stream", "false")],
)
def test_numbers_and_flags_are_not_converted_from_strings(
    server: Any, field: str, value: Any
) -> None:
    body = {
        "model": MODEL,
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": "hi"}],
    }
    response = httpx.post(server.base_url + "/v1/messages", json={**body, field: value}, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert field in error["message"]


def test_unknown_model(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        _ask(client, model="claude-nonexistent")
    assert caught.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


def test_image_rejected(client: anthropic.Anthropic) -> None:
    image: ImageBlockParam = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    message: MessageParam = {"role": "user", "content": [image]}
    with pytest.raises(anthropic.BadRequestError, match="image"):
        client.messages.create(model=MODEL, max_tokens=MAX_TOKENS, messages=[message])


def test_unknown_block_rejected(server: Any) -> None:
    body = {
        "model": MODEL,
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": [{"type": "video", "url": "x"}]}],
    }
    response = httpx.post(server.base_url + "/v1/messages", json=body, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("messages.0.content")


def _tool_turn(
    client: anthropic.Anthropic,
    messages: list[MessageParam],
    model: str,
    tool_choice: ToolChoiceParam,
    system: str | anthropic.Omit = anthropic.omit,
    max_tokens: int = 48,
) -> Message:
    return client.messages.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        extra_body=GREEDY,
        tools=[WEATHER],
        tool_choice=tool_choice,
        system=system,
    )


def _answer_call(messages: list[MessageParam], called: Message, result: str) -> ToolUseBlock:
    """Append the assistant turn and a tool_result for its (first) call; return the call."""
    use = next(block for block in called.content if block.type == "tool_use")
    messages += [
        {"role": "assistant", "content": called.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": result}],
        },
    ]
    return use


def test_tool_use_round_trip(client: anthropic.Anthropic, server: Any) -> None:
    question: MessageParam = {"role": "user", "content": "What is the weather in Paris?"}
    messages: list[MessageParam] = [question]
    called = _tool_turn(client, messages, MODEL, tool_choice=FORCE_WEATHER)
    assert called.stop_reason == "tool_use"
    assert [block.type for block in called.content] == ["tool_use"]
    use = _answer_call(messages, called, "Sunny, 21 C")
    assert use.id.startswith("toolu_") and use.name == "get_weather"
    assert isinstance(use.input, dict) and isinstance(use.input.get("city"), str)
    answer = _tool_turn(client, messages, MODEL, tool_choice={"type": "none"})
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [block.type for block in answer.content] == ["text"]
    # The result reached the prompt: a longer one makes it longer by the tokens added.
    longer: list[MessageParam] = [question]
    _answer_call(longer, called, "Sunny, 21 C" + MORE)
    again = _tool_turn(client, longer, MODEL, tool_choice={"type": "none"}, max_tokens=1)
    added = _prompt_tokens(again) - _prompt_tokens(answer)
    assert added == tokens_of_more(server.base_url, MODEL)


def _prompt_tokens(message: Message) -> int:
    return message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


def test_streamed_tool_use(client: anthropic.Anthropic) -> None:
    messages: list[MessageParam] = [{"role": "user", "content": "Weather in Oslo?"}]
    with client.messages.stream(
        model=MODEL,
        messages=messages,
        max_tokens=48,
        extra_body=GREEDY,
        tools=[WEATHER],
        tool_choice=FORCE_ANY,
    ) as stream:
        final = stream.get_final_message()
    plain = _tool_turn(client, messages, MODEL, tool_choice=FORCE_ANY)
    assert final.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == [
        (b.type, getattr(b, "input", None)) for b in plain.content
    ]


def test_imc_hits_across_tool_conversation(client: anthropic.Anthropic, imc_model: str) -> None:
    """Each user turn answers the previous call and asks again; turns 2 and 3 reuse the KV."""
    system = "You are a weather assistant. Call get_weather for every city the user names."
    messages: list[MessageParam] = []
    cached: list[int] = []
    result: list[ToolResultBlockParam] = []
    for turn, city in enumerate(["Paris", "Rome", "Lima"]):
        messages.append(
            {"role": "user", "content": [*result, {"type": "text", "text": f"Weather in {city}?"}]}
        )
        called = _tool_turn(client, messages, imc_model, system=system, tool_choice=FORCE_WEATHER)
        cached.append(called.usage.cache_read_input_tokens or 0)
        use = next(block for block in called.content if block.type == "tool_use")
        messages.append({"role": "assistant", "content": called.content})
        result = [{"type": "tool_result", "tool_use_id": use.id, "content": f"{turn + 18} C"}]
    assert cached[0] == 0
    assert all(count > 0 for count in cached[1:]), cached
