"""Tool calling through the OpenAI chat dialect, against a real server and the `openai` SDK.

The default model is a small base model: forced calls (tool_choice required or
named) are what makes it call a tool, and the grammar built from the tools'
schemas is what makes the call valid.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from kronk_llamacpp.packaged import GEMMA_MODEL_ID

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_SCHEMA = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 20}},
    "required": ["timezone"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": WEATHER_SCHEMA,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The current time in a timezone.",
            "parameters": TIME_SCHEMA,
        },
    },
]
SCHEMAS = {"get_weather": WEATHER_SCHEMA, "get_time": TIME_SCHEMA}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def client(server: Any) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def _chat(client: openai.OpenAI, **params: Any) -> Any:
    defaults: dict[str, Any] = {
        "model": GEMMA_MODEL_ID,
        "messages": QUESTION,
        "tools": TOOLS,
        "temperature": 0,
        "max_tokens": 60,
    }
    return client.chat.completions.create(**{**defaults, **params})


def _check_call(call: Any) -> dict[str, Any]:
    assert call.type == "function"
    assert call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return dict(arguments)


def test_named_tool_choice_forces_a_valid_call(client: openai.OpenAI) -> None:
    result = _chat(client, tool_choice=WEATHER)
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    _check_call(call)


def test_required_calls_one_of_the_tools(client: openai.OpenAI) -> None:
    result = _chat(client, tool_choice="required", parallel_tool_calls=False)
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name in SCHEMAS
    _check_call(call)


def test_streamed_tool_call_reassembles_to_the_same_call(
    client: openai.OpenAI, server: Any
) -> None:
    whole = _chat(client, tool_choice=WEATHER).choices[0].message.tool_calls[0]
    body = {
        "model": GEMMA_MODEL_ID,
        "messages": QUESTION,
        "tools": TOOLS,
        "tool_choice": WEATHER,
        "temperature": 0,
        "max_tokens": 60,
        "stream": True,
    }
    pieces: list[dict[str, Any]] = []
    finish = None
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            pieces += choice["delta"].get("tool_calls", [])
            finish = choice["finish_reason"] or finish
    assert finish == "tool_calls"
    head, *rest = pieces
    assert head["index"] == 0 and head["id"] and head["function"]["name"] == "get_weather"
    assert all("id" not in piece and piece["index"] == 0 for piece in rest)
    arguments = head["function"]["arguments"] + "".join(p["function"]["arguments"] for p in rest)
    assert json.loads(arguments) == json.loads(whole.function.arguments)

    # The SDK's stream helper puts the same call back together.
    with client.chat.completions.stream(
        model=GEMMA_MODEL_ID,
        messages=QUESTION,  # type: ignore[arg-type]
        tools=TOOLS,
        tool_choice=WEATHER,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=60,
    ) as stream:
        final = stream.get_final_completion()
    [call] = final.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == json.loads(whole.function.arguments)


def test_tool_result_round_trip(client: openai.OpenAI) -> None:
    first = _chat(client, tool_choice=WEATHER).choices[0].message
    [call] = first.tool_calls
    messages: list[Any] = [
        *QUESTION,
        {
            "role": "assistant",
            "content": None,
            # Non-compliant clients send the arguments as an object: accepted too.
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": json.loads(call.function.arguments),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees."},
    ]
    result = _chat(
        client,
        messages=messages,
        tool_choice="none",
        max_tokens=12,
        extra_body={"return_prompt": True},
    )
    answer = result.choices[0]
    assert answer.finish_reason in ("stop", "length")
    assert answer.message.tool_calls is None
    assert answer.message.content
    # The model read the call and its result: both are in the prompt, in order.
    prompt = (result.model_extra or {})["prompt"]
    question, city = QUESTION[0]["content"], json.loads(call.function.arguments)["city"]
    called_at = prompt.index('"get_weather"', prompt.index(question))
    assert prompt.index(city, called_at) < prompt.index("Sunny, 21 degrees.")


def test_tool_choice_none_gives_text(client: openai.OpenAI) -> None:
    choice = _chat(client, tool_choice="none", max_tokens=8).choices[0]
    assert choice.message.tool_calls is None
    assert choice.finish_reason in ("stop", "length")
    assert choice.message.content


def test_call_cut_by_max_tokens_is_content(client: openai.OpenAI) -> None:
    choice = _chat(client, tool_choice=WEATHER, max_tokens=4).choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.tool_calls is None
    assert choice.message.content and choice.message.content.lstrip().startswith("{")


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
        ({"tool_choice": "required", "tools": []}, "tools"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": WEATHER, "response_format": {"type": "json_object"}}, "tool call"),
    ],
)
def test_bad_tool_requests_are_400(
    client: openai.OpenAI, params: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, **params)
    assert fragment in str(info.value)


def test_bad_arguments_in_history_are_400(client: openai.OpenAI) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{"}}
    messages: list[Any] = [*QUESTION, {"role": "assistant", "tool_calls": [call]}]
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, messages=messages)
    assert "JSON object" in str(info.value)


def test_imc_hits_across_a_tool_conversation(client: openai.OpenAI, imc_model: str) -> None:
    messages: list[Any] = list(QUESTION)
    cached: list[int] = []
    for turn in range(3):
        result = _chat(client, model=imc_model, messages=messages, tool_choice=WEATHER)
        assert result.usage is not None and result.usage.prompt_tokens_details is not None
        cached.append(result.usage.prompt_tokens_details.cached_tokens or 0)
        [call] = result.choices[0].message.tool_calls
        messages += [
            {"role": "assistant", "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": f"Result {turn}: sunny."},
            {"role": "user", "content": "And tomorrow?"},
        ]
    assert all(count > 0 for count in cached[1:]), cached
