"""Splitting a leading reasoning block (`<think>…</think>`, `[THINK]…[/THINK]`) from the answer."""

from __future__ import annotations

from enum import Enum, auto

from kronk_core.contract import ChatDelta, OutputParser
from kronk_templates.formats.base import Deltas, StepParser
from kronk_templates.formats.text import held_prefix

THINK_TAGS = ("<think>", "</think>")


class _State(Enum):
    START = auto()  # nothing decided: the output may still open a block
    INSIDE = auto()
    CLOSED = auto()  # just closed: whitespace before the answer is dropped
    ANSWER = auto()


class ReasoningParser(StepParser):
    """Reasoning deltas for the block, the rest handed to `inner` (the family's parser).

    Only a block at the very start counts, as Qwen3 and DeepSeek-R1 write it;
    whitespace around the reasoning is trimmed.
    """

    def __init__(self, inner: OutputParser, tags: tuple[str, str], *, opened: bool) -> None:
        super().__init__()
        self._inner = inner
        self._open, self._close = tags
        self._state = _State.INSIDE if opened else _State.START
        self._reasoned = False  # some reasoning went out (later whitespace is kept)

    def finish(self, *, truncated: bool) -> list[ChatDelta]:
        out = Deltas()
        if self._state is _State.INSIDE:
            self._reason(out, self._buf.rstrip())
        elif self._state in (_State.START, _State.ANSWER):
            out.extend(self._inner.feed(self._buf))
        self._buf = ""
        out.extend(self._inner.finish(truncated=truncated))
        return out.items

    def _step(self, out: Deltas) -> bool:
        buf = self._buf
        if self._state is _State.START:
            stripped = buf.lstrip()
            if stripped.startswith(self._open):
                self._buf = stripped[len(self._open) :]
                self._state = _State.INSIDE
                return True
            if not stripped or self._open.startswith(stripped):
                return False
            self._state = _State.ANSWER
        if self._state is _State.INSIDE:
            end = buf.find(self._close)
            if end >= 0:
                self._reason(out, buf[:end].rstrip())
                self._buf = buf[end + len(self._close) :]
                self._state = _State.CLOSED
                return True
            # Hold a possible closing tag and trailing whitespace (trimmed if the block ends).
            keep = len(buf) - held_prefix(buf, (self._close,))
            keep = len(buf[:keep].rstrip())
            self._reason(out, buf[:keep])
            self._buf = buf[keep:]
            return False
        if self._state is _State.CLOSED:
            self._buf = buf.lstrip()
            if not self._buf:
                return False
            self._state = _State.ANSWER
        out.extend(self._inner.feed(self._buf))
        self._buf = ""
        return False

    def _reason(self, out: Deltas, text: str) -> None:
        if not self._reasoned:
            text = text.lstrip()
        self._reasoned = self._reasoned or bool(text)
        out.reasoning(text)


def with_reasoning(
    inner: OutputParser, tags: tuple[str, str], *, think: bool, reasoning_open: bool
) -> OutputParser:
    if not (think or reasoning_open):
        return inner
    return ReasoningParser(inner, tags, opened=reasoning_open)
