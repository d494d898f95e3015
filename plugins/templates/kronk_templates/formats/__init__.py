"""Tool-call and reasoning formats per model family: output parsers, forced-call constraints."""

from __future__ import annotations

from kronk_templates.formats.base import ToolFormat
from kronk_templates.formats.gemma import GemmaFormat
from kronk_templates.formats.harmony import HarmonyFormat
from kronk_templates.formats.hermes import HermesFormat
from kronk_templates.formats.llama3 import Llama3Format
from kronk_templates.formats.mistral import MistralFormat
from kronk_templates.formats.qwen3_coder import Qwen3CoderFormat

FORMATS: dict[str, ToolFormat] = {
    format.name: format
    for format in (
        HermesFormat(),
        Qwen3CoderFormat(),
        Llama3Format(),
        HarmonyFormat(),
        MistralFormat("mistral", array_calls=False),
        MistralFormat("mistral_nemo", array_calls=True),
        GemmaFormat(),
    )
}

# Markup a chat template writes for tool calls, most specific first.
_MARKERS = (
    (("<tool_call>", "<function="), "qwen3_coder"),
    (("<tool_call>",), "hermes"),
    (("<|channel|>",), "harmony"),
    (("[TOOL_CALLS]", "[ARGS]"), "mistral"),
    (("[TOOL_CALLS]",), "mistral_nemo"),
    (("<|python_tag|>",), "llama3"),
    (("<|start_header_id|>",), "llama3"),
)
_THINK_MARKERS = ("<think>", "</think>", "[THINK]")


def detect_format(template_source: str | None, architecture: str) -> str:
    """The family whose markup this chat template writes (a key of FORMATS).

    Gemma models and models without a template get the default model's bare
    JSON. Anything else unknown gets hermes: the most common markup among
    current open models, and `<tool_call>` never turns up in plain prose, so
    reading for it costs a model that does not write it nothing.
    """
    if template_source:
        for markers, name in _MARKERS:
            if all(marker in template_source for marker in markers):
                return name
    if not template_source or architecture.lower().startswith("gemma"):
        return "gemma"
    return "hermes"


def uses_think(template_source: str | None) -> bool:
    """Whether the template's models reason in a `<think>` (or Mistral `[THINK]`) block."""
    return template_source is not None and any(m in template_source for m in _THINK_MARKERS)


def reasoning_opened(prompt: str) -> bool:
    """Whether the rendered prompt ends inside an opened reasoning block (DeepSeek-R1, Qwen3)."""
    tail = prompt.rstrip()
    return tail.endswith("<think>") or tail.endswith("[THINK]")


__all__ = ["FORMATS", "ToolFormat", "detect_format", "reasoning_opened", "uses_think"]
