"""What a template processor does: messages to prompt text, generated text back to parts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from kronk_core.contract.backend import ModelInfo
from kronk_core.contract.registry import RegistryKind
from kronk_core.contract.types import ChatDelta, ChatMessage, StructuredOutput, ToolChoice, ToolSpec

if TYPE_CHECKING:
    from kronk_core.settings.config import ModelConfig

TemplateValue = str | int | float | bool | None


@dataclass(frozen=True, slots=True)
class RenderOptions:
    add_generation_prompt: bool = True
    enable_thinking: bool = True
    reasoning_effort: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    template_kwargs: Mapping[str, TemplateValue] = field(default_factory=dict)


class OutputParser(Protocol):
    """Incremental: turns generated text, as it arrives, into content/reasoning/tool-call deltas.

    Text that may still turn out to be markup (a partial `<tool_call>` tag, an
    unfinished call) is held back until it is decided.
    """

    def feed(self, text: str) -> list[ChatDelta]: ...

    def finish(self, *, truncated: bool) -> list[ChatDelta]:
        """Flush what was held back at the end of generation.

        `truncated` is true when max_tokens cut the generation: an unfinished
        tool call then comes back as content, never as a call.
        """


class PlainText:
    """The parser of a raw completion: every piece of text is content, as generated."""

    def feed(self, text: str) -> list[ChatDelta]:
        return [ChatDelta(content=text)]

    def finish(self, *, truncated: bool) -> list[ChatDelta]:
        return []


class TemplateProcessor(Protocol):
    name: str
    # The parser needs control tokens (Harmony channels, [TOOL_CALLS]) rendered as text.
    special_tokens_as_text: bool
    # The control token's text that opens the assistant's turn (`<start_of_turn>`,
    # `<|im_start|>`), None where the template has none: a model that generates it starts
    # a turn of its own, so it ends the answer (a base model in a chat template does).
    turn_opener: str | None

    def render(self, messages: Sequence[ChatMessage], options: RenderOptions) -> str:
        """The prompt text for these messages; raises TemplateError on failure."""

    def parser(self, options: RenderOptions, prompt: str) -> OutputParser:
        """A fresh parser for one generation that follows `prompt` (rendered with `options`).

        Tool calls are parsed only when `options.tools` is not empty; the
        prompt tells whether the template opened a reasoning block already.
        """

    def tool_constraint(
        self, tools: Sequence[ToolSpec], choice: ToolChoice, parallel: bool
    ) -> StructuredOutput | str:
        """What generation must look like to call a tool (choice "required" or "function").

        A StructuredOutput (JSON pieces in the format's markup) or a GBNF
        grammar; the output must parse back into the call(s) with `parser`.
        """


class TemplateProcessorFactory(Protocol):
    """What `kronk_register_template_processors` registers: one processor per model load."""

    def __call__(
        self, *, model_config: ModelConfig, model_info: ModelInfo
    ) -> TemplateProcessor: ...


TEMPLATE_PROCESSORS: RegistryKind[TemplateProcessorFactory] = RegistryKind("template_processors")
