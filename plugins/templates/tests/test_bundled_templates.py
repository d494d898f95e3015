"""The bundled templates render tools, tool calls and tool results in their family's markup,
and what they render as a call is what the family's parser reads back."""

from __future__ import annotations

import json

import pytest

from kronk_core.contract.templates import RenderOptions
from kronk_core.contract.types import ChatMessage, ToolCall, ToolSpec
from kronk_templates.formats import FORMATS, detect_format
from kronk_templates.jinja import JinjaTemplateProcessor, bundled_source

TOOL = ToolSpec(
    name="get_weather",
    description="Weather in a city.",
    parameters_json='{"type": "object", "properties": {"city": {"type": "string"}}}',
)
CALL = ToolCall(id="call_1", name="get_weather", arguments='{"city": "Oslo"}')
CONVERSATION = (
    ChatMessage(role="system", content="Be brief."),
    ChatMessage(role="user", content="Weather in Oslo?"),
    ChatMessage(role="assistant", tool_calls=(CALL,)),
    ChatMessage(role="tool", tool_call_id="call_1", content="Rain."),
)
TOOL_JSON = (
    '{"name": "get_weather", "description": "Weather in a city.", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}'
)


def _processor(name: str) -> JinjaTemplateProcessor:
    source = bundled_source(name)
    tool_format = FORMATS[detect_format(source, "gemma3" if name == "gemma" else "llama")]
    return JinjaTemplateProcessor(name, source, "<bos>", "<eos>", tool_format, think=False)


def test_gemma_renders_tools_calls_and_results() -> None:
    prompt = _processor("gemma").render(CONVERSATION, RenderOptions(tools=(TOOL,)))
    assert prompt == (
        "<bos><start_of_turn>user\n"
        "You can call these functions:\n"
        f"{TOOL_JSON}\n"
        'To call a function, answer with only a JSON object {"name": <function name>, '
        '"arguments": <arguments object>} and nothing else.\n\n'
        "Be brief.\n\nWeather in Oslo?<end_of_turn>\n"
        "<start_of_turn>model\n"
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}<end_of_turn>\n'
        "<start_of_turn>user\nFunction result:\nRain.<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_chatml_renders_hermes_markup() -> None:
    prompt = _processor("chatml").render(CONVERSATION, RenderOptions(tools=(TOOL,)))
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert (
        f"<tools>\n{json.dumps({'type': 'function', 'function': json.loads(TOOL_JSON)})}\n</tools>"
        in prompt
    )
    assert prompt.endswith(
        "<|im_start|>user\nWeather in Oslo?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nRain.\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_llama3_renders_json_calls_and_ipython_results() -> None:
    prompt = _processor("llama3").render(CONVERSATION, RenderOptions(tools=(TOOL,)))
    assert "Given the following functions" in prompt
    assert prompt.endswith(
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}<|eot_id|>'
        "<|start_header_id|>ipython<|end_header_id|>\n\nRain.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


@pytest.mark.parametrize("name", ["gemma", "chatml", "llama3"])
def test_rendered_call_parses_back(name: str) -> None:
    """The assistant turn as the template renders it is a call to the family's parser."""
    processor = _processor(name)
    options = RenderOptions(tools=(TOOL,))
    before = processor.render(CONVERSATION[:2], options)
    after = processor.render(
        CONVERSATION[:3], RenderOptions(tools=(TOOL,), add_generation_prompt=False)
    )
    assert after.startswith(before)
    parser = processor.parser(options, before)
    deltas = parser.feed(
        after[len(before) :].split("<end_of_turn>")[0].split("<|im_end|>")[0].split("<|eot_id|>")[0]
    )
    deltas += parser.finish(truncated=False)
    calls = [call for delta in deltas for call in delta.tool_calls]
    assert [(call.name, json.loads(call.arguments)) for call in calls] == [
        ("get_weather", {"city": "Oslo"})
    ]
    assert "".join(delta.content for delta in deltas).strip() == ""


def test_without_tools_nothing_about_tools_is_rendered() -> None:
    for name in ("gemma", "chatml", "llama3"):
        prompt = _processor(name).render(CONVERSATION[:2], RenderOptions())
        assert "get_weather" not in prompt and "function" not in prompt.lower()


# SmolLM2-135M-Instruct's own template: ChatML that never mentions `tools`.
PLAIN_CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.mark.parametrize("system", [None, "Be brief."])
def test_a_template_that_ignores_tools_still_shows_them(system: str | None) -> None:
    """Kronk writes the tool list and the format's call markup into the system turn itself;
    a call written as the example shows parses back."""
    tool_format = FORMATS[detect_format(PLAIN_CHATML, "llama")]
    processor = JinjaTemplateProcessor("plain", PLAIN_CHATML, "", "", tool_format, think=False)
    assert not processor.renders_tools and _processor("chatml").renders_tools
    question = ChatMessage(role="user", content="Weather in Oslo?")
    messages = (
        (question,) if system is None else (ChatMessage(role="system", content=system), question)
    )
    options = RenderOptions(tools=(TOOL,))
    prompt = processor.render(messages, options)
    opening = "<|im_start|>system\n" + ("" if system is None else f"{system}\n\n") + "# Tools\n"
    assert prompt.startswith(opening), prompt
    assert f"{TOOL_JSON}\n" in prompt
    assert tool_format.call_example in prompt and "<tool_call>" in tool_format.call_example
    assert "helpful AI assistant" not in prompt
    assert processor.render(messages, RenderOptions()).count("# Tools") == 0

    parser = processor.parser(options, prompt)
    call = tool_format.call_example.replace("<function-name>", '"get_weather"').replace(
        "<args-json-object>", '{"city": "Oslo"}'
    )
    deltas = [*parser.feed(call), *parser.finish(truncated=False)]
    calls = [call for delta in deltas for call in delta.tool_calls]
    assert [(call.name, json.loads(call.arguments)) for call in calls] == [
        ("get_weather", {"city": "Oslo"})
    ]


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_shows_a_call_example(name: str) -> None:
    example = FORMATS[name].call_example
    assert "<function-name>" in example
