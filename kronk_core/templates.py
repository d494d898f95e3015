"""What a template processor does: messages to prompt text, generated text back to parts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kronk_core.types import ChatDelta, ChatMessage, ToolSpec

TemplateValue = str | int | float | bool | None


@dataclass(frozen=True, slots=True)
class RenderOptions:
    add_generation_prompt: bool = True
    enable_thinking: bool = True
    reasoning_effort: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    template_kwargs: Mapping[str, TemplateValue] = field(default_factory=dict)


class OutputParser(Protocol):
    """Incremental: turns generated text, as it arrives, into content/reasoning/tool-call deltas."""

    def feed(self, text: str) -> list[ChatDelta]: ...

    def finish(self) -> list[ChatDelta]:
        """Flush whatever was held back at the end of generation."""


class TemplateProcessor(Protocol):
    name: str

    def render(self, messages: Sequence[ChatMessage], options: RenderOptions) -> str:
        """The prompt text for these messages; raises TemplateError on failure."""

    def parser(self, options: RenderOptions) -> OutputParser: ...
