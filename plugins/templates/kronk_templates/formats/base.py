"""The ToolFormat protocol, and what every parser hands back: parsed calls and deltas."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kronk_core.templates import OutputParser
from kronk_core.types import ChatDelta, StructuredOutput, ToolCall, ToolChoice, ToolSpec

NewId = Callable[[], str]


class ToolFormat(Protocol):
    """One model family's tool-call markup: how to read it back and how to force it."""

    name: str
    # The parser needs control tokens (Harmony channels, [TOOL_CALLS], <|python_tag|>) as text.
    special_tokens_as_text: bool
    # One call in this markup with placeholders, shown to models whose template ignores tools.
    call_example: str

    def parser(
        self,
        *,
        tools: Sequence[ToolSpec],
        parse_tools: bool,
        think: bool,
        reasoning_open: bool,
        new_id: NewId,
    ) -> OutputParser:
        """A fresh parser for one generation.

        `parse_tools` false leaves tool markup as content; `think` splits the
        family's reasoning block out; `reasoning_open` means the prompt opened
        it already. `tools` give parameter types to formats that need them.
        """

    def constraint(
        self, tools: Sequence[ToolSpec], choice: ToolChoice, parallel: bool
    ) -> StructuredOutput | str:
        """Generation that must call a tool ("required" or "function" choice), in this markup.

        Raises InvalidRequestError (param "tool_choice") for a name not among `tools`.
        """


@dataclass(frozen=True, slots=True)
class ParsedCall:
    """A call read from markup; `arguments` is compact JSON of an object, `id` the model's own."""

    name: str
    arguments: str
    id: str | None = None


class Deltas:
    """Collects a parser's output, merging neighbouring text of the same kind."""

    def __init__(self) -> None:
        self.items: list[ChatDelta] = []

    def content(self, text: str) -> None:
        self._add(ChatDelta(content=text))

    def reasoning(self, text: str) -> None:
        self._add(ChatDelta(reasoning=text))

    def call(self, call: ToolCall) -> None:
        self.items.append(ChatDelta(tool_calls=(call,)))

    def extend(self, deltas: Sequence[ChatDelta]) -> None:
        for delta in deltas:
            if delta.tool_calls:
                self.items.append(delta)
            else:
                self._add(delta)

    def _add(self, text: ChatDelta) -> None:
        if not (text.content or text.reasoning):
            return
        last = self.items[-1] if self.items else None
        if last is None or last.tool_calls or bool(last.content) != bool(text.content):
            self.items.append(text)
        else:
            merged = ChatDelta(last.content + text.content, last.reasoning + text.reasoning)
            self.items[-1] = merged


class StepParser(ABC):
    """A parser that works through its buffer in steps, each handling what the text allows."""

    def __init__(self) -> None:
        self._buf = ""

    def feed(self, text: str) -> list[ChatDelta]:
        out = Deltas()
        self._buf += text
        while self._buf and self._step(out):
            pass
        return out.items

    @abstractmethod
    def _step(self, out: Deltas) -> bool:
        """Handle the start of `_buf`; false when it must wait for more text."""
