"""Reasoning end to end: a template that opens a <think> block in the generation prompt.

The default model never closes the block, so everything it writes is reasoning:
that makes the split and the reasoning-token count exact to check.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from kronk_core import Kronk, KronkConfig
from kronk_core.sdk import collect
from kronk_core.settings.config import ModelConfig
from kronk_llamacpp.packaged import GEMMA_MODEL_SETTINGS
from kronk_testing.templates import THINKING_GEMMA

MODEL = "thinking-gemma"
QUESTION = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture(scope="module")
def thinking(tmp_path_factory: pytest.TempPathFactory, gemma_path: str) -> Iterator[Kronk]:
    folder = tmp_path_factory.mktemp("thinking")
    template = folder / "thinking-gemma.jinja"
    template.write_text(THINKING_GEMMA, encoding="utf-8")
    settings = {
        **GEMMA_MODEL_SETTINGS,
        "templates": {"template": str(template)},
        "model_path": gemma_path,
    }
    settings["n_seq_max"] = 1
    config = KronkConfig(base_path=folder, models={MODEL: ModelConfig.model_validate(settings)})
    with Kronk(config) as kronk:
        yield kronk


async def test_opened_block_is_reasoning(thinking: Kronk) -> None:
    result = await thinking.chat(QUESTION, model=MODEL, max_tokens=12, temperature=0)
    assert result.content == ""
    assert result.reasoning.strip()
    assert result.usage.reasoning_tokens == result.usage.completion_tokens == 12


async def test_streamed_reasoning_equals_whole(thinking: Kronk) -> None:
    whole = await thinking.chat(QUESTION, model=MODEL, max_tokens=12, temperature=0)
    parts = [
        delta.reasoning
        async for delta in thinking.chat_stream(QUESTION, model=MODEL, max_tokens=12, temperature=0)
    ]
    assert "".join(parts) == whole.reasoning


async def test_thinking_off_gives_content(thinking: Kronk) -> None:
    result = await thinking.chat(
        QUESTION, model=MODEL, max_tokens=12, temperature=0, enable_thinking=False
    )
    assert result.reasoning == "" and result.usage.reasoning_tokens == 0
    assert result.content


async def test_a_grammar_turns_thinking_off(thinking: Kronk) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "boolean"}}}
    schema["required"] = ["answer"]
    request = thinking.chat_request(
        QUESTION, model=MODEL, max_tokens=20, temperature=0, json_schema=json.dumps(schema)
    )
    result = await collect(await thinking.start_chat(request))
    assert result.reasoning == ""
    assert isinstance(json.loads(result.content)["answer"], bool)


def test_reasoning_history_renders_in_the_prompt(thinking: Kronk) -> None:
    loaded = thinking.load(MODEL)
    messages = [
        *QUESTION,
        {"role": "assistant", "content": "Scattering.", "reasoning_content": "Light scatters."},
        {"role": "user", "content": "More?"},
    ]
    request = thinking.chat_request(messages, model=MODEL)
    prompt = loaded.template.render(request.messages, thinking.render_options(request))
    assert prompt.endswith(
        "<start_of_turn>model\n<think>Light scatters.</think>Scattering.<end_of_turn>\n"
        "<start_of_turn>user\nMore?<end_of_turn>\n<start_of_turn>model\n<think>\n"
    )
