"""Tool-call arguments stream as they are generated, in every dialect, through the official SDKs.

A forced call at temperature 0 is deterministic: the streamed answer, put back
together by each SDK, must equal the non-streamed one, and the arguments must
arrive in more than one fragment.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import openai
import pytest

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_llamacpp.packaged import GEMMA_MODEL_ID, default_model_path
from kronk_templates.formats import FORMATS

if TYPE_CHECKING:
    from kronk_testing.server import Serve

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather.", "parameters": WEATHER},
    }
]
FORCED: Any = {"type": "function", "function": {"name": "get_weather"}}
CHAT: dict[str, Any] = {
    "model": GEMMA_MODEL_ID,
    "messages": QUESTION,
    "tools": TOOLS,
    "tool_choice": FORCED,
    "temperature": 0,
    "max_tokens": 60,
}


@pytest.fixture(scope="module")
def client(server: Any) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def claude(server: Any) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0) as c:
        yield c


def _fragments(server: Any, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The payloads of a server-sent event stream."""
    payloads = []
    with httpx.stream("POST", server.base_url + path, json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                payloads.append(json.loads(line[6:]))
    return payloads


def test_chat_completions_stream_the_arguments(client: openai.OpenAI, server: Any) -> None:
    whole = client.chat.completions.create(**CHAT).choices[0]
    [call] = whole.message.tool_calls or []
    with client.chat.completions.stream(**CHAT) as stream:
        final = stream.get_final_completion()
    [streamed] = final.choices[0].message.tool_calls or []
    assert streamed.id.startswith("call_") and streamed.function.name == "get_weather"
    assert streamed.function.arguments == call.function.arguments
    assert final.choices[0].finish_reason == whole.finish_reason == "tool_calls"

    pieces = [
        piece
        for chunk in _fragments(server, "/v1/chat/completions", {**CHAT, "stream": True})
        for choice in chunk["choices"]
        for piece in choice["delta"].get("tool_calls", [])
    ]
    head, *rest = pieces
    assert head["id"].startswith("call_") and head["function"]["name"] == "get_weather"
    assert all("id" not in piece and piece["index"] == 0 for piece in rest)
    fragments = [head["function"]["arguments"], *(p["function"]["arguments"] for p in rest)]
    assert len([f for f in fragments if f]) > 1  # streamed, not whole
    assert "".join(fragments) == call.function.arguments


def test_responses_stream_the_arguments(client: openai.OpenAI, server: Any) -> None:
    tools: Any = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    params: dict[str, Any] = {
        "model": GEMMA_MODEL_ID,
        "input": "What is the weather in Paris?",
        "tools": tools,
        "tool_choice": {"type": "function", "name": "get_weather"},
        "temperature": 0,
        "max_output_tokens": 60,
    }
    whole = client.responses.create(**params)
    assert whole.completed_at is not None and whole.completed_at >= whole.created_at
    [call] = [item for item in whole.output if item.type == "function_call"]
    deltas: list[str] = []
    with client.responses.stream(**params) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                deltas.append(event.delta)
            elif event.type == "response.function_call_arguments.done":
                assert event.arguments == "".join(deltas)
        final = stream.get_final_response()
    [streamed] = [item for item in final.output if item.type == "function_call"]
    assert len(deltas) > 1
    assert streamed.arguments == "".join(deltas) == call.arguments
    assert streamed.name == "get_weather"
    assert final.completed_at is not None


def test_anthropic_messages_stream_the_input(claude: anthropic.Anthropic, server: Any) -> None:
    params: dict[str, Any] = {
        "model": GEMMA_MODEL_ID,
        "messages": QUESTION,
        "tools": [{"name": "get_weather", "description": "Weather.", "input_schema": WEATHER}],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "max_tokens": 60,
    }
    whole = claude.messages.create(**params, extra_body={"temperature": 0})
    with claude.messages.stream(**params, extra_body={"temperature": 0}) as stream:
        final = stream.get_final_message()
    [call] = [block for block in whole.content if block.type == "tool_use"]
    [streamed] = [block for block in final.content if block.type == "tool_use"]
    assert (streamed.name, streamed.input) == (call.name, call.input)
    assert final.stop_reason == whole.stop_reason == "tool_use"

    events = _fragments(server, "/v1/messages", {**params, "temperature": 0, "stream": True})
    start = next(e for e in events if e["type"] == "content_block_start")
    assert start["content_block"]["type"] == "tool_use"
    assert start["content_block"]["input"] == {}
    partial = [
        e["delta"]["partial_json"]
        for e in events
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
    ]
    assert len(partial) > 1
    assert json.loads("".join(partial)) == call.input


def test_a_call_cut_by_max_tokens_is_closed(client: openai.OpenAI) -> None:
    """Cut off once its arguments started, a call stays a call: its JSON closed where it stopped."""
    whole = client.chat.completions.create(**CHAT).choices[0].message.tool_calls or []
    arguments = json.loads(whole[0].function.arguments)
    cut = client.chat.completions.create(**{**CHAT, "max_tokens": 16}).choices[0]
    assert cut.finish_reason == "length"
    [call] = cut.message.tool_calls or []
    partial = json.loads(call.function.arguments)
    assert isinstance(partial, dict)
    assert all(key in arguments for key in partial)


# ---- every tool-call format, through both SDKs' stream helpers ---------------------------


@pytest.fixture(scope="module")
def every_format(tmp_path_factory: pytest.TempPathFactory, serve: Serve) -> Iterator[str]:
    """The default model once per tool format: a forced call is written in that format's
    markup (its grammar spells it out) and read back by that format's parser."""
    models = {
        f"calls-{name}": ModelConfig.model_validate(
            {
                "model_path": default_model_path(),
                "context_window": 2048,
                "n_seq_max": 1,
                "templates": {"template": "chatml", "tool_format": name},
            }
        )
        for name in FORMATS
    }
    base = tmp_path_factory.mktemp("formats")
    kronk = Kronk(KronkConfig(base_path=base, models=models, models_in_cache=1))
    with serve(create_app(ServerSettings(base_path=base), kronk=kronk)) as base_url:
        yield base_url


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_streams_what_it_answers_whole(every_format: str, name: str) -> None:
    model = f"calls-{name}"
    # Markup such as Harmony's is many tokens in a vocabulary without its control tokens.
    body = {**CHAT, "model": model, "max_tokens": 160}
    with openai.OpenAI(base_url=f"{every_format}/v1", api_key="unused", max_retries=0) as client:
        whole = client.chat.completions.create(**body).choices[0]
        with client.chat.completions.stream(**body) as stream:
            final = stream.get_final_completion().choices[0]
    [call] = whole.message.tool_calls or []
    [streamed] = final.message.tool_calls or []
    assert (streamed.function.name, streamed.function.arguments) == (
        call.function.name,
        call.function.arguments,
    )
    assert json.loads(call.function.arguments)["unit"] in ("celsius", "fahrenheit")
    params: dict[str, Any] = {
        "model": model,
        "messages": QUESTION,
        "tools": [{"name": "get_weather", "description": "Weather.", "input_schema": WEATHER}],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "max_tokens": 160,
        "extra_body": {"temperature": 0},
    }
    with anthropic.Anthropic(base_url=every_format, api_key="unused", max_retries=0) as claude:
        whole_message = claude.messages.create(**params)
        with claude.messages.stream(**params) as message_stream:
            final_message = message_stream.get_final_message()
    [use] = [block for block in whole_message.content if block.type == "tool_use"]
    [streamed_use] = [block for block in final_message.content if block.type == "tool_use"]
    assert (streamed_use.name, streamed_use.input) == (use.name, use.input)
    assert use.input == json.loads(call.function.arguments)
