"""The ToolFormat protocol, and what every parser hands back: parsed calls and deltas."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kronk_core.contract import (
    ChatDelta,
    OutputParser,
    StructuredOutput,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolSpec,
)

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

    def call_piece(self, piece: ToolCallDelta) -> None:
        last = self.items[-1].tool_call_deltas if self.items else ()
        if last and last[-1].id == piece.id and piece.name is None:
            # Fragments of one call that arrive together go out as one.
            merged = ToolCallDelta(piece.id, last[-1].name, last[-1].arguments + piece.arguments)
            self.items[-1] = ChatDelta(tool_call_deltas=(merged,))
        else:
            self.items.append(ChatDelta(tool_call_deltas=(piece,)))

    def extend(self, deltas: Sequence[ChatDelta]) -> None:
        for delta in deltas:
            if delta.tool_calls:
                self.items.append(delta)
            elif delta.tool_call_deltas:
                for piece in delta.tool_call_deltas:
                    self.call_piece(piece)
            else:
                self._add(delta)

    def _add(self, text: ChatDelta) -> None:
        if not (text.content or text.reasoning):
            return
        last = self.items[-1] if self.items else None
        if (
            last is None
            or last.tool_calls
            or last.tool_call_deltas
            or bool(last.content) != bool(text.content)
        ):
            self.items.append(text)
        else:
            merged = ChatDelta(last.content + text.content, last.reasoning + text.reasoning)
            self.items[-1] = merged


class CallWriter:
    """Writes the calls of one answer as they stream: a head with the id and name, the
    arguments' fragments, then the whole call, whose arguments are the fragments joined."""

    def __init__(self, new_id: NewId) -> None:
        self._new_id = new_id
        self._id = ""
        self._name = ""
        self._arguments: list[str] = []
        self.open = False

    def start(self, out: Deltas, name: str, own_id: str | None = None) -> None:
        assert not self.open
        self._id, self._name, self._arguments = own_id or self._new_id(), name, []
        self.open = True
        out.call_piece(ToolCallDelta(self._id, name=name))

    def arguments(self, out: Deltas, text: str) -> None:
        assert self.open
        if text:
            self._arguments.append(text)
            out.call_piece(ToolCallDelta(self._id, arguments=text))

    def end(self, out: Deltas) -> None:
        assert self.open
        self.open = False
        out.call(ToolCall(id=self._id, name=self._name, arguments="".join(self._arguments)))

    def whole(self, out: Deltas, call: ParsedCall) -> None:
        """A call read in one piece (its markup could not be read as it went)."""
        self.start(out, call.name, call.id)
        self.arguments(out, call.arguments)
        self.end(out)


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
