"""POST /v1/responses against a real server, through the official `openai` SDK and httpx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from kronk_llamacpp.packaged import GEMMA_MODEL_ID
from kronk_testing.tool_results import MORE, tokens_of_more

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
FORCE_WEATHER = {"type": "function", "name": "get_weather"}
PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
MESSAGE_EVENTS = [
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


@pytest.fixture(scope="module")
def client(server: Any) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def _create(client: openai.OpenAI, **params: Any) -> Any:
    defaults: dict[str, Any] = {
        "model": GEMMA_MODEL_ID,
        "input": "Write one sentence about the sea.",
        "temperature": 0,
        "max_output_tokens": 12,
    }
    return client.responses.create(**{**defaults, **params})


def _collapse(types: list[str]) -> list[str]:
    """Runs of the same event type as one entry (deltas come in runs)."""
    return [kind for index, kind in enumerate(types) if index == 0 or types[index - 1] != kind]


def test_text_response(client: openai.OpenAI) -> None:
    response = _create(client, instructions="Answer briefly.", max_output_tokens=40)
    assert response.id.startswith("resp_")
    assert response.object == "response"
    assert response.model == GEMMA_MODEL_ID
    assert response.status in ("completed", "incomplete")
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text == message.content[0].text != ""
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_kronk_sampling_fields_are_honoured(client: openai.OpenAI) -> None:
    greedy = _create(client)
    # top_k 1 leaves one candidate: the greedy text, however hot the temperature.
    top_k = _create(client, temperature=1.5, extra_body={"top_k": 1, "seed": 7})
    assert top_k.output_text == greedy.output_text
    hot = {"temperature": 1.5, "max_output_tokens": 24, "extra_body": {"seed": 7}}
    assert _create(client, **hot).output_text == _create(client, **hot).output_text


def test_incomplete_on_max_output_tokens(client: openai.OpenAI) -> None:
    response = _create(client, max_output_tokens=3)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3
    assert response.output[0].status == "incomplete"


def test_stream_events_in_order(client: openai.OpenAI) -> None:
    whole = _create(client)
    stream = _create(client, stream=True)
    events = list(stream)
    types = [event.type for event in events]
    final = "response.incomplete" if whole.status == "incomplete" else "response.completed"
    assert _collapse(types) == ["response.created", "response.in_progress", *MESSAGE_EVENTS, final]
    assert [event.sequence_number for event in events] == list(range(1, len(events) + 1))
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == whole.output_text
    assert events[-1].response.output_text == whole.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens


def test_function_call_round_trip(client: openai.OpenAI, server: Any) -> None:
    question = "What is the weather in Oslo?"
    first = _create(
        client,
        input=question,
        tools=[WEATHER_TOOL],
        tool_choice=FORCE_WEATHER,
        max_output_tokens=40,
    )
    assert first.status == "completed"
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER_TOOL["parameters"])
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "Rain, 9 C."}

    # The client sends the whole conversation back ...
    explicit = _create(
        client,
        input=[
            {"role": "user", "content": question},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            output,
        ],
        tools=[WEATHER_TOOL],
        tool_choice="none",
    )
    # ... or only what is new, with previous_response_id: the same prompt either way.
    chained = _create(
        client,
        input=[output],
        previous_response_id=first.id,
        tools=[WEATHER_TOOL],
        tool_choice="none",
    )
    assert explicit.output[0].type == "message"
    assert chained.output_text == explicit.output_text
    assert chained.usage.input_tokens == explicit.usage.input_tokens
    # The output reached the prompt: a longer one makes it longer by the tokens added.
    longer = _create(
        client,
        input=[{**output, "output": output["output"] + MORE}],
        previous_response_id=first.id,
        tools=[WEATHER_TOOL],
        tool_choice="none",
        max_output_tokens=1,
    )
    added = longer.usage.input_tokens - chained.usage.input_tokens
    assert added == tokens_of_more(server.base_url, GEMMA_MODEL_ID)


def test_streamed_function_call(client: openai.OpenAI) -> None:
    events = list(
        _create(
            client,
            input="Weather in Rome?",
            tools=[WEATHER_TOOL],
            tool_choice=FORCE_WEATHER,
            max_output_tokens=40,
            stream=True,
        )
    )
    types = [event.type for event in events]
    assert _collapse(types) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == done.arguments
    jsonschema.validate(json.loads(done.arguments), WEATHER_TOOL["parameters"])


def test_json_schema_output(client: openai.OpenAI) -> None:
    response = _create(
        client,
        input="Invent a person.",
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON_SCHEMA}},
        max_output_tokens=60,
    )
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), PERSON_SCHEMA)


def test_store_false_and_unknown_ids(client: openai.OpenAI, server: Any) -> None:
    stored = _create(client, max_output_tokens=2)
    assert client.responses.retrieve(stored.id).id == stored.id
    private = _create(client, max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(private.id)
    with pytest.raises(openai.NotFoundError) as info:
        _create(client, previous_response_id=private.id)
    assert private.id in str(info.value)
    deleted = httpx.delete(f"{server.base_url}/v1/responses/{stored.id}", timeout=30)
    assert deleted.json()["deleted"] is True
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(stored.id)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"input": "hi"}, "model"),
        ({"model": GEMMA_MODEL_ID, "input": [{"type": "nope"}]}, "input"),
        ({"model": GEMMA_MODEL_ID, "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": GEMMA_MODEL_ID, "input": "hi", "background": True}, "background"),
        ({"model": GEMMA_MODEL_ID, "input": "hi", "conversation": "conv_1"}, "conversation"),
        (
            {
                "model": GEMMA_MODEL_ID,
                "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
            },
            "image_url: expected a data: or http(s) URL",
        ),
    ],
)
def test_bad_requests_are_400(server: Any, body: dict[str, Any], fragment: str) -> None:
    response = httpx.post(server.base_url + "/v1/responses", json=body, timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert fragment in error["message"]


def test_imc_hits_across_chained_responses(client: openai.OpenAI, imc_model: str) -> None:
    first = _create(
        client,
        model=imc_model,
        input="Weather in Lima?",
        tools=[WEATHER_TOOL],
        tool_choice=FORCE_WEATHER,
        max_output_tokens=40,
    )
    previous, cached = first, []
    for turn in range(2):
        call = next(item for item in previous.output if item.type == "function_call")
        previous = _create(
            client,
            model=imc_model,
            previous_response_id=previous.id,
            input=[
                {"type": "function_call_output", "call_id": call.call_id, "output": f"Sun {turn}"},
                {"role": "user", "content": "And tomorrow?"},
            ],
            tools=[WEATHER_TOOL],
            tool_choice=FORCE_WEATHER,
            max_output_tokens=40,
        )
        cached.append(previous.usage.input_tokens_details.cached_tokens)
    assert all(count > 0 for count in cached), cached
