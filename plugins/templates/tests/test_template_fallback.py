"""A chat template that fails renders the request with the bundled ChatML instead, as
llama.cpp does, with a warning; a GGUF's template that does not parse is ChatML from the
load; a template the configuration names that does not parse fails the load."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kronk_core.contract.backend import ModelInfo
from kronk_core.contract.errors import ConfigError, TemplateError
from kronk_core.contract.registry import Registry
from kronk_core.contract.templates import RenderOptions
from kronk_core.contract.types import ChatMessage
from kronk_core.settings.config import ModelConfig
from kronk_templates.formats import FORMATS, ToolFormat
from kronk_templates.jinja import JinjaTemplateProcessor, bundled_source
from kronk_templates.plugin import jinja_processor
from kronk_testing.plugin import ScriptedKronk

# Mistral's rule: roles alternate, so a system message after the first turn raises.
ALTERNATING = (
    "{%- for m in messages -%}"
    "{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}"
    "{%- endif -%}[{{ m['role'] }}]{{ m['content'] }}"
    "{%- endfor -%}"
)
# What the sandbox cannot do: a number added to a text.
BROKEN = "{{ messages | length + 'turns' }}"
CONVERSATION = (
    ChatMessage(role="system", content="Be brief."),
    ChatMessage(role="user", content="Hello there."),
)
TEMPLATE_LOG = "kronk_templates"


def processor(name: str, source: str, fallback: bool = True) -> JinjaTemplateProcessor:
    hermes = FORMATS["hermes"]
    chatml = JinjaTemplateProcessor("chatml", bundled_source("chatml"), "", "", hermes, False)
    return JinjaTemplateProcessor(name, source, "", "", hermes, False, chatml if fallback else None)


@pytest.mark.parametrize(
    ("source", "failure"),
    [
        (ALTERNATING, "chat template: Conversation roles must alternate"),
        (BROKEN, "chat template 'gguf' failed: unsupported operand type"),
    ],
)
def test_a_failing_template_renders_the_request_as_chatml_with_one_warning(
    source: str, failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    own = processor("gguf", source)
    with caplog.at_level(logging.DEBUG, logger=TEMPLATE_LOG):
        first = own.render(CONVERSATION, RenderOptions())
        second = own.render(CONVERSATION, RenderOptions())
    expected = processor("chatml", bundled_source("chatml"), fallback=False)
    assert first == second == expected.render(CONVERSATION, RenderOptions())
    assert "<|im_start|>system\nBe brief.<|im_end|>" in first
    records = [r for r in caplog.records if r.getMessage().startswith(failure)]
    assert [r.levelno for r in records] == [logging.WARNING, logging.DEBUG]
    assert records[0].getMessage().endswith("; rendered the request with chatml instead")


def test_a_template_that_renders_is_not_replaced() -> None:
    alternating = processor("gguf", ALTERNATING)
    turns = (ChatMessage(role="user", content="Hi."), ChatMessage(role="assistant", content="Yo."))
    assert alternating.render(turns, RenderOptions()) == "[user]Hi.[assistant]Yo."


def test_without_a_fallback_the_failure_is_a_template_error() -> None:
    with pytest.raises(TemplateError, match="Conversation roles must alternate"):
        processor("chatml", ALTERNATING, fallback=False).render(CONVERSATION, RenderOptions())


def formats() -> Registry[ToolFormat]:
    registry: Registry[ToolFormat] = Registry("tool_formats")
    for name, tool_format in FORMATS.items():
        registry.add(name, tool_format, "templates")
    return registry


def model_info(chat_template: str | None) -> ModelInfo:
    return ModelInfo(
        id="m", path="m.gguf", architecture="qwen2", n_ctx_train=4096, n_ctx_per_seq=4096,
        n_seq_max=1, n_vocab=100, bos_token="", eos_token="<|im_end|>",
        chat_template=chat_template,
    )  # fmt: skip


def test_a_gguf_template_that_does_not_parse_is_chatml_from_the_load(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = ModelConfig(id="m", model_path="m.gguf")
    with caplog.at_level(logging.WARNING, logger=TEMPLATE_LOG):
        chosen = jinja_processor(formats(), model_config=config, model_info=model_info("{% if %}"))
    assert chosen.name == "chatml"
    (warning,) = [r for r in caplog.records if "rendering ChatML instead" in r.getMessage()]
    assert "chat template 'gguf' does not parse" in warning.getMessage()
    assert chosen.render(CONVERSATION, RenderOptions()).startswith("<|im_start|>system\n")


def test_a_configured_template_that_does_not_parse_fails_the_load(tmp_path: Path) -> None:
    broken = tmp_path / "mine.jinja"
    broken.write_text("{% if %}", encoding="utf-8")
    config = ModelConfig.model_validate(
        {"id": "m", "model_path": "m.gguf", "templates": {"template": str(broken)}}
    )
    with pytest.raises(ConfigError, match="chat template 'mine' does not parse"):
        jinja_processor(formats(), model_config=config, model_info=model_info(None))


async def test_a_request_the_template_refuses_is_answered(
    scripted_kronk: ScriptedKronk, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Through the SDK: a 200 with an answer, where the template alone would be a 400."""
    template = tmp_path / "alternating.jinja"
    template.write_text(ALTERNATING, encoding="utf-8")
    kronk = scripted_kronk({"m": {"templates": {"template": str(template)}}})
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."}]
    with caplog.at_level(logging.WARNING, logger=TEMPLATE_LOG):
        result = await kronk.chat(messages, model="m", max_tokens=4)
    assert result.content
    assert result.usage.prompt_tokens > 0
    assert any("roles must alternate" in r.getMessage() for r in caplog.records)
