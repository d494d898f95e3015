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

from kronk_core.contract import (
    ChatDelta,
    JsonSegment,
    OutputParser,
    StructuredOutput,
    ToolChoice,
    ToolSpec,
)
from kronk_templates.formats.base import CallWriter, Deltas, NewId, ParsedCall
from kronk_templates.formats.calls import JsonReader
from kronk_templates.formats.constraints import json_constraint
from kronk_templates.formats.jsonscan import JsonScanner
from kronk_templates.formats.jsonstream import JsonLexer
from kronk_templates.formats.reasoning import THINK_TAGS, with_reasoning
from kronk_templates.formats.text import find_first, held_prefix

ReadCalls = Callable[[str], list[ParsedCall] | None]
WHITESPACE = " \t\r\n"


class Block(Protocol):
    """One call's markup after its opener; calls go out through the block's CallWriter."""

    def feed(self, text: str, out: Deltas) -> int | None:
        """Take more text; the index in `text` just past the block's end, or None."""

    def close(self, out: Deltas, *, closed: bool, truncated: bool) -> bool:
        """The block is over (`closed`: its end was seen); false when its markup is content.

        A call that started streaming is ended (its arguments closed where they
        stop); one that had not started is read from the whole markup, except
        when `truncated` (max_tokens cut it), which makes it content.
        """


class JsonBlock:
    """JSON values (one, or with `many` several between whitespace), then, when `closes`
    are given, whitespace and one of those tags.

    `lead` is the part of the JSON its opener already took (a leading `{`).
    Other text after the JSON ends the block, malformed: unlike a plain search
    for the tag, a closing tag inside a JSON string does not end the call.
    The `reader` streams calls from the tokens; `read` reads a block in which
    no call started streaming, whole, as it always was.
    """

    def __init__(
        self,
        reader: JsonReader,
        read: ReadCalls,
        lead: str = "",
        closes: tuple[str, ...] = (),
        many: bool = False,
    ) -> None:
        self._reader = reader
        self._read = read
        self._closes = closes
        self._many = many
        self._json = ""
        self._tail: str | None = None  # text after a value, once it ended
        self._bad = False
        self._scanner = JsonScanner()
        self._lexer: JsonLexer | None = JsonLexer()
        # The lead (`{`, `[`) only opens a value: nothing is written for it.
        self._value(lead, Deltas())

    def feed(self, text: str, out: Deltas) -> int | None:
        at = 0
        while True:
            if self._tail is None:
                end = self._value(text[at:], out)
                if end is None:
                    return None
                at += end
                if not (self._closes or self._many):
                    return at
                self._tail = ""
            before = len(self._tail)
            self._tail += text[at:]
            rest = self._tail.lstrip()
            skipped = len(self._tail) - len(rest)
            for close in self._closes:
                if rest.startswith(close):
                    return at + skipped + len(close) - before
            if self._many and rest[:1] in ("{", "["):
                self._json += self._tail[:skipped]
                at += skipped - before
                self._tail, self._scanner, self._lexer = None, JsonScanner(), JsonLexer()
                continue
            if not rest or any(close.startswith(rest) for close in self._closes):
                return None
            self._bad = True
            if self._reader.started:
                # The calls stand; what came after them is content.
                out.content(self._tail[:before])
            return at

    def _value(self, text: str, out: Deltas) -> int | None:
        """Feed one value's text; the index past its end, or None."""
        end = self._scanner.feed(text)
        part = text if end is None else text[:end]
        self._json += part
        if self._lexer is not None:
            self._reader.tokens(self._lexer.feed(part), out)
            if self._lexer.broken:
                self._lexer = None
                self._reader.broken(out)
        return end

    def close(self, out: Deltas, *, closed: bool, truncated: bool) -> bool:
        if self._reader.started:
            self._reader.close(out)
            return True
        if truncated or self._bad:
            return False
        calls = self._read(self._json)
        if calls is None:
            return False
        for call in calls:
            self._reader.writer.whole(out, call)
        return True


class EndBlock:
    """Runs to the end of the message (Llama's `<|python_tag|>` calls end with <|eom_id|>);
    read whole at the end, since code and builtin calls are known only then."""

    def __init__(self, writer: CallWriter, read: ReadCalls) -> None:
        self._writer = writer
        self._read = read
        self._text = ""

    def feed(self, text: str, out: Deltas) -> int | None:
        self._text += text
        return None

    def close(self, out: Deltas, *, closed: bool, truncated: bool) -> bool:
        calls = None if truncated else self._read(self._text)
        for call in calls or ():
            self._writer.whole(out, call)
        return calls is not None


@dataclass(frozen=True, slots=True)
class Opener:
    text: str
    block: Callable[[CallWriter], Block]
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
        self._calls = CallWriter(new_id)
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
            end = self._block.feed(rest, out)
            if end is None:
                self._raw += rest
                break
            self._raw += rest[:end]
            rest = rest[end:]
            self._close(out, closed=True, truncated=False)
        return out.items

    def finish(self, *, truncated: bool) -> list[ChatDelta]:
        out = Deltas()
        if self._block is not None:
            self._close(out, closed=False, truncated=truncated)
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
            self._block = opener.block(self._calls)
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

    def _close(self, out: Deltas, *, closed: bool, truncated: bool) -> None:
        assert self._block is not None
        calls = self._block.close(out, closed=closed, truncated=truncated)
        self._block = None
        if not calls:
            out.content(self._raw)
            self._at_start = False
            return
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
