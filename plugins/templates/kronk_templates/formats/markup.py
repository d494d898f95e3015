"""The parser shared by formats whose calls are blocks of markup between content.

A format names its openers (`<tool_call>`, `[TOOL_CALLS]`, a leading `{`) and,
for each, a Block that finds where the call ends and reads it. Content streams
out as soon as it cannot be the start of an opener.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kronk_core.templates import OutputParser
from kronk_core.types import (
    ChatDelta,
    JsonSegment,
    StructuredOutput,
    ToolCall,
    ToolChoice,
    ToolSpec,
)
from kronk_templates.formats.base import Deltas, NewId, ParsedCall
from kronk_templates.formats.constraints import json_constraint
from kronk_templates.formats.jsonscan import JsonScanner
from kronk_templates.formats.reasoning import THINK_TAGS, with_reasoning
from kronk_templates.formats.text import find_first, held_prefix

ReadCalls = Callable[[str], list[ParsedCall] | None]
WHITESPACE = " \t\r\n"


class Block(Protocol):
    """One call's markup after its opener."""

    def feed(self, text: str) -> int | None:
        """Take more text; the index in `text` just past the block's end, or None."""

    def calls(self, *, closed: bool) -> list[ParsedCall] | None:
        """The calls read so far (`closed`: the end was seen); None when malformed."""


class ClosedBlock:
    """Ends at a closing tag (`</tool_call>`); the text before it is read by `read`."""

    def __init__(self, close: str, read: ReadCalls) -> None:
        self._close = close
        self._read = read
        self._text = ""

    def feed(self, text: str) -> int | None:
        before = len(self._text)
        self._text += text
        end = self._text.find(self._close, max(0, before - len(self._close) + 1))
        if end < 0:
            return None
        self._text = self._text[:end]
        return end + len(self._close) - before

    def calls(self, *, closed: bool) -> list[ParsedCall] | None:
        return self._read(self._text)


class JsonBlock:
    """A JSON object or array, then (when `closes` are given) whitespace and one of those tags.

    `lead` is the part of the JSON its opener already took (a leading `{`).
    Other text after the JSON ends the block, malformed: unlike a plain search
    for the tag, a closing tag inside a JSON string does not end the call.
    """

    def __init__(self, read: ReadCalls, lead: str = "", closes: tuple[str, ...] = ()) -> None:
        self._read = read
        self._lead = lead
        self._closes = closes
        self._json = ""
        self._tail: str | None = None  # text after the JSON, once it ended
        self._bad = False
        self._scanner = JsonScanner()
        self._scanner.feed(lead)

    def feed(self, text: str) -> int | None:
        at = 0
        if self._tail is None:
            end = self._scanner.feed(text)
            self._json += text if end is None else text[:end]
            if end is None or not self._closes:
                return end
            self._tail = ""
            at = end
        before = len(self._tail)
        self._tail += text[at:]
        rest = self._tail.lstrip()
        for close in self._closes:
            if rest.startswith(close):
                return at + len(self._tail) - len(rest) + len(close) - before
        if any(close.startswith(rest) for close in self._closes):
            return None
        self._bad = True
        return at

    def calls(self, *, closed: bool) -> list[ParsedCall] | None:
        if self._bad:
            return None
        return self._read(self._lead + self._json)


class EndBlock:
    """Runs to the end of the message (Llama's `<|python_tag|>` calls end with <|eom_id|>)."""

    def __init__(self, read: ReadCalls) -> None:
        self._read = read
        self._text = ""

    def feed(self, text: str) -> int | None:
        self._text += text
        return None

    def calls(self, *, closed: bool) -> list[ParsedCall] | None:
        return self._read(self._text)


@dataclass(frozen=True, slots=True)
class Opener:
    text: str
    block: Callable[[], Block]
    # Only at the start of the message or right after a call (bare JSON formats).
    leading: bool = False


class MarkupParser:
    """Content until an opener, then the opener's block, then content again.

    A block that does not read as calls comes back as content, exactly as
    generated. Gap text (whitespace, for Llama also `;`) around calls is dropped.
    """

    def __init__(self, openers: Sequence[Opener], new_id: NewId, gap: str = WHITESPACE) -> None:
        self._openers = openers
        self._anywhere = {opener.text: opener for opener in openers if not opener.leading}
        self._leading = sorted((o for o in openers if o.leading), key=lambda o: -len(o.text))
        self._new_id = new_id
        self._gap = gap
        self._buf = ""  # content not yet decided
        self._block: Block | None = None
        self._raw = ""  # the open block's markup as generated, for when it is not a call
        self._at_start = True  # no content since the message start or the last call
        self._called = False

    def feed(self, text: str) -> list[ChatDelta]:
        out = Deltas()
        rest: str | None = text
        while rest is not None:
            if self._block is None:
                self._buf += rest
                rest = self._scan(out)
                continue
            end = self._block.feed(rest)
            if end is None:
                self._raw += rest
                break
            self._raw += rest[:end]
            rest = rest[end:]
            self._close(out, closed=True)
        return out.items

    def finish(self, *, truncated: bool) -> list[ChatDelta]:
        out = Deltas()
        if self._block is not None:
            if truncated:
                self._block = None
                out.content(self._raw)
            else:
                self._close(out, closed=False)
        elif not (self._called and self._at_start and self._is_gap(self._buf)):
            out.content(self._buf)
        self._buf = ""
        return out.items

    def _scan(self, out: Deltas) -> str | None:
        """Emit the content `_buf` allows; the text after an opener when one opened a block."""
        buf = self._buf
        lead = len(buf) - len(buf.lstrip(self._gap)) if self._at_start else 0
        hit = self._find_opener(buf, lead)
        if hit is not None:
            at, opener = hit
            before = buf[:at]
            self._raw = opener.text
            if self._at_start and self._is_gap(before):
                self._raw = before + opener.text
            else:
                out.content(before)
            self._block = opener.block()
            self._buf = ""
            return buf[at + len(opener.text) :]
        if self._at_start:
            if lead == len(buf) or any(o.text.startswith(buf[lead:]) for o in self._openers):
                return None
            self._at_start = False
        keep = len(buf) - held_prefix(buf, self._anywhere)
        out.content(buf[:keep])
        self._buf = buf[keep:]
        return None

    def _find_opener(self, buf: str, lead: int) -> tuple[int, Opener] | None:
        if self._at_start:
            for opener in self._leading:
                if buf.startswith(opener.text, lead):
                    return lead, opener
        found = find_first(buf, self._anywhere)
        return None if found is None else (found[0], self._anywhere[found[1]])

    def _close(self, out: Deltas, *, closed: bool) -> None:
        assert self._block is not None
        calls = self._block.calls(closed=closed)
        self._block = None
        if calls is None:
            out.content(self._raw)
            self._at_start = False
            return
        for call in calls:
            out.call(
                ToolCall(id=call.id or self._new_id(), name=call.name, arguments=call.arguments)
            )
        self._at_start = self._called = True

    def _is_gap(self, text: str) -> bool:
        return not text.strip(self._gap)


class MarkupFormat(ABC):
    """A family whose calls are blocks of markup: the parser comes from its openers."""

    name: str
    special_tokens_as_text = False
    think_tags = THINK_TAGS
    gap = WHITESPACE
    # Whether several calls may follow one another in one answer.
    parallel = True

    @abstractmethod
    def openers(self, tools: Sequence[ToolSpec]) -> Sequence[Opener]:
        """The markup that starts a call, and how to read the block it opens."""

    def ids(self, new_id: NewId) -> NewId:
        """How this family's call ids are made from the caller's."""
        return new_id

    def parser(
        self,
        *,
        tools: Sequence[ToolSpec],
        parse_tools: bool,
        think: bool,
        reasoning_open: bool,
        new_id: NewId,
    ) -> OutputParser:
        openers = self.openers(tools) if parse_tools else ()
        inner = MarkupParser(openers, self.ids(new_id), self.gap)
        return with_reasoning(inner, self.think_tags, think=think, reasoning_open=reasoning_open)

    @abstractmethod
    def constraint(
        self, tools: Sequence[ToolSpec], choice: ToolChoice, parallel: bool
    ) -> StructuredOutput | str:
        """Forced calls in this family's markup (see ToolFormat.constraint)."""


class JsonMarkupFormat(MarkupFormat):
    """A family whose calls carry JSON: forced calls are one JSON segment per allowed tool."""

    @abstractmethod
    def segment(self, tool: ToolSpec) -> JsonSegment:
        """One forced call of `tool`, which `openers` read back."""

    def constraint(
        self, tools: Sequence[ToolSpec], choice: ToolChoice, parallel: bool
    ) -> StructuredOutput | str:
        return json_constraint(tools, choice, self.segment, repeat=parallel and self.parallel)
