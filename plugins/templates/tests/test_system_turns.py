"""A system message among the messages (Claude Code's, Anthropic's role "system") renders
where the client put it: as a system turn of its own when the template can, otherwise
merged into the neighbouring user turn, never dropped and never inside the model's turn."""

from __future__ import annotations

import pytest

from kronk_core.contract.templates import RenderOptions
from kronk_core.contract.types import ChatMessage
from kronk_templates.formats import FORMATS
from kronk_templates.jinja import JinjaTemplateProcessor, bundled_source, merge_system_turns

CONVERSATION = (
    ChatMessage(role="system", content="RULES"),
    ChatMessage(role="user", content="Q1"),
    ChatMessage(role="system", content="LATER"),
    ChatMessage(role="assistant", content="A1"),
    ChatMessage(role="user", content="Q2"),
    ChatMessage(role="assistant", content="A2"),
    ChatMessage(role="system", content="LAST"),
)
# The alternation check of Gemma's and Mistral's own templates: a system message after the
# first raises.
ALTERNATING = (
    "{%- if messages[0]['role'] == 'system' -%}{%- set rest = messages[1:] -%}"
    "{%- set sys = messages[0]['content'] ~ '\\n\\n' -%}"
    "{%- else -%}{%- set rest = messages -%}{%- set sys = '' -%}{%- endif -%}"
    "{%- for m in rest -%}"
    "{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}"
    "{%- endif -%}"
    "{%- if m['role'] == 'user' -%}[INST]{{ (sys if loop.first else '') ~ m['content'] }}[/INST]"
    "{%- else -%}{{ m['content'] }}</s>{%- endif -%}"
    "{%- endfor -%}"
)
# A template that renders only user and assistant turns: a later system message would vanish.
DROPPING = (
    "{%- for m in messages -%}"
    "{%- if m['role'] in ('user', 'assistant') -%}<{{ m['role'] }}>{{ m['content'] }}"
    "{%- endif -%}{%- endfor -%}"
)


def _processor(name: str, source: str) -> JinjaTemplateProcessor:
    return JinjaTemplateProcessor(name, source, "<bos>", "<eos>", FORMATS["hermes"], think=False)


@pytest.mark.parametrize("name", ["chatml", "llama3"])
def test_templates_with_system_turns_render_them_where_they_stand(name: str) -> None:
    processor = _processor(name, bundled_source(name))
    assert processor.system_turns_anywhere()
    prompt = processor.render(CONVERSATION, RenderOptions())
    order = [prompt.index(text) for text in ("RULES", "Q1", "LATER", "A1", "Q2", "A2", "LAST")]
    assert order == sorted(order)
    assert "Q1LATER" not in prompt.replace("\n", "")


@pytest.mark.parametrize(
    ("name", "source"),
    [("gemma", bundled_source("gemma")), ("alternating", ALTERNATING), ("dropping", DROPPING)],
)
def test_other_templates_get_them_merged_into_user_turns(name: str, source: str) -> None:
    processor = _processor(name, source)
    assert not processor.system_turns_anywhere()
    prompt = processor.render(CONVERSATION, RenderOptions())
    order = [prompt.index(text) for text in ("Q1", "LATER", "A1", "Q2", "A2", "LAST")]
    assert order == sorted(order)
    if name == "gemma":
        # Joined to the user turn it follows; the last one, after the model's turn, opens
        # a user turn of its own before the generation prompt.
        assert "RULES\n\nQ1\n\nLATER<end_of_turn>" in prompt
        assert "<start_of_turn>model\nA1" in prompt
        assert prompt.endswith("<start_of_turn>user\nLAST<end_of_turn>\n<start_of_turn>model\n")


def test_merge_keeps_each_message_in_its_place() -> None:
    def turn(role: str, content: str | None) -> dict[str, str | None]:
        return {"role": role, "content": content}

    assert merge_system_turns(
        [
            turn("system", "S0"),
            turn("developer", "D0"),
            turn("user", "U1"),
            turn("system", "S1"),
            turn("assistant", "A1"),
            turn("system", "S2"),
            turn("tool", "T1"),
            turn("system", "S3"),
            turn("user", "U2"),
            turn("assistant", None),
            turn("system", "S4"),
        ]
    ) == [
        turn("system", "S0\n\nD0"),
        turn("user", "U1\n\nS1"),
        turn("assistant", "A1"),
        turn("tool", "T1"),
        turn("user", "S2\n\nS3\n\nU2"),
        turn("assistant", None),
        turn("user", "S4"),
    ]
    # Without a leading system message, one after the first user turn joins it.
    assert merge_system_turns([turn("user", "U1"), turn("system", "S1")]) == [
        turn("user", "U1\n\nS1")
    ]
