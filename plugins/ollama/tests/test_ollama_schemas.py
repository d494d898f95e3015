"""The Ollama dialect without a model: names, keep_alive, options and think onto core types,
and the keep-alive line."""

from __future__ import annotations

import json
from typing import Any

import ollama
import pytest
from pydantic import ValidationError

from kronk_core.contract.media import MediaSources
from kronk_core.contract.types import ToolChoice
from kronk_ollama.answers import Answer
from kronk_ollama.schemas import ChatBody, GenerateBody, keep_alive_seconds, model_id, ollama_name


@pytest.mark.parametrize(
    ("name", "kronk_id"),
    [
        ("SmolLM2:latest", "SmolLM2"),
        ("SmolLM2", "SmolLM2"),
        ("unsloth/Qwen3-8B-GGUF:Q4_K_M", "unsloth/Qwen3-8B-GGUF:Q4_K_M"),
    ],
)
def test_latest_is_the_model_itself(name: str, kronk_id: str) -> None:
    assert model_id(name) == kronk_id
    assert model_id(ollama_name(kronk_id)) == kronk_id


def test_listed_names_get_the_latest_tag_unless_they_have_one() -> None:
    assert ollama_name("SmolLM2") == "SmolLM2:latest"
    assert ollama_name("org/repo:Q4_K_M") == "org/repo:Q4_K_M"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        ("0", 0.0),
        (300, 300.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        (-1, None),
        ("-1m", None),
    ],
)
def test_keep_alive(value: float | str, seconds: float | None) -> None:
    assert keep_alive_seconds(value) == seconds


def _chat(**body: Any) -> ChatBody:
    return ChatBody.model_validate(
        {"model": "m:latest", "messages": [{"role": "user", "content": "hi"}], **body}
    )


def test_options_become_sampling_and_limits() -> None:
    sampling = {
        "temperature": 0.2,
        "top_k": 5,
        "top_p": 0.5,
        "min_p": 0.1,
        "seed": 7,
        "repeat_penalty": 1.1,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
    }
    # num_ctx is ignored: the model's config entry sets its context.
    options = {**sampling, "num_predict": 12, "stop": ["\n\n"], "num_ctx": 8192}
    request = _chat(options=options).to_core(MediaSources())
    assert request.model == "m"
    assert request.sampling is not None
    assert request.sampling.model_dump(exclude_none=True) == sampling
    assert request.max_tokens == 12 and request.stop == ("\n\n",)
    assert _chat(options={"num_predict": -1}).to_core(MediaSources()).max_tokens is None


@pytest.mark.parametrize(
    ("think", "enabled", "effort"),
    [(None, None, None), (True, True, None), (False, False, None), ("high", True, "high")],
)
def test_think_turns_reasoning_on_or_off(
    think: bool | str | None, enabled: bool | None, effort: str | None
) -> None:
    request = _chat(think=think).to_core(MediaSources())
    assert (request.enable_thinking, request.reasoning_effort) == (enabled, effort)


def test_format_and_tools_map_onto_structured_output() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert json.loads(_chat(format=schema).to_core(MediaSources()).json_schema or "") == schema
    assert _chat(format="json").to_core(MediaSources()).json_schema == '{"type": "object"}'
    assert _chat(format="").to_core(MediaSources()).json_schema is None
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    request = _chat(tools=[tool], tool_choice="required").to_core(MediaSources())
    assert [spec.name for spec in request.tools] == ["f"]
    assert request.tool_choice == ToolChoice("required")


def test_history_tool_calls_take_object_arguments() -> None:
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
        },
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
    ]
    request = ChatBody.model_validate({"model": "m", "messages": messages}).to_core(MediaSources())
    call = request.messages[1].tool_calls[0]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Oslo"})
    assert request.messages[2].name == "get_weather"
    assert not request.continue_final_message


def test_a_final_assistant_message_is_continued() -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    body = ChatBody.model_validate({"model": "m", "messages": messages})
    assert body.to_core(MediaSources()).continue_final_message


def test_generate_puts_system_before_the_prompt() -> None:
    body = GenerateBody.model_validate({"model": "m", "prompt": "Hi", "system": "Be brief."})
    request = body.to_chat(MediaSources())
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "Be brief."),
        ("user", "Hi"),
    ]


@pytest.mark.parametrize(
    "body",
    [
        {"raw": True, "system": "x"},
        {"raw": True, "format": "json"},
        {"suffix": "tail"},
        {"keep_alive": "a while"},
        {"options": {"mirostat": 3}},
        {"options": {"tfs_z": 0.9}},
        {"options": {"num_predict": 0}},
        {"options": {"num_predict": 5, "max_tokens": 5}},
        {"options": {"nonsense": 1}},
    ],
)
def test_generate_refuses(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        GenerateBody.model_validate({"model": "m", "prompt": "Hi", **body})


@pytest.mark.parametrize("chat", [True, False])
def test_the_keepalive_line_is_an_empty_piece_clients_read(chat: bool) -> None:
    line = Answer("m:latest", chat=chat, started=0.0).keepalive()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    if chat:
        piece = ollama.ChatResponse.model_validate_json(line)
        assert piece.message.content == ""
    else:
        assert ollama.GenerateResponse.model_validate_json(line).response == ""
    assert json.loads(line)["done"] is False
