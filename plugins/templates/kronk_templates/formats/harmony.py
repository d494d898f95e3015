"""GPT-OSS Harmony: messages on channels.

    <|channel|>analysis<|message|>…<|end|>                      reasoning
    <|start|>assistant<|channel|>final<|message|>…<|return|>    content
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>
        {…}<|call|>                                             a call of NAME

The generation prompt ends with `<|start|>assistant`, so output starts with a
header; `to=` may also come before `<|channel|>`. Output that does not start
like a header is plain content (a model that does not speak Harmony).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from kronk_core.contract import (
    ChatDelta,
    JsonSegment,
    OutputParser,
    StructuredOutput,
    ToolChoice,
    ToolSpec,
)
from kronk_templates.formats.base import CallWriter, Deltas, NewId, ParsedCall, StepParser
from kronk_templates.formats.calls import ArgumentsReader, arguments_text, compact_json
from kronk_templates.formats.constraints import json_constraint, parameters_schema
from kronk_templates.formats.markup import JsonBlock
from kronk_templates.formats.text import find_first, held_prefix

_MESSAGE = "<|message|>"
_START = "<|start|>"
_CALL_ENDS = ("<|call|>", "<|end|>", "<|return|>")
# `<|start|>` ends a message too: a model that skips `<|end|>` still starts the next one.
_ENDS = (*_CALL_ENDS, _START)
_HEADER_STARTS = (_START, "<|channel|>", "<|constrain|>", _MESSAGE, " to=", "to=")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_FUNCTIONS = "functions."


class HarmonyParser(StepParser):
    def __init__(self, *, parse_tools: bool, new_id: NewId) -> None:
        super().__init__()
        self._parse_tools = parse_tools
        self._calls = CallWriter(new_id)
        self._in_body = False  # else reading a header
        self._plain = False  # the output is not Harmony at all: everything is content
        self._channel = ""
        self._call: JsonBlock | None = None  # the open message is a tool call
        self._raw = ""  # the call's markup as generated, for when it is not a call

    def finish(self, *, truncated: bool) -> list[ChatDelta]:
        # An unfinished header carries no text and is dropped.
        out = Deltas()
        if self._call is not None:
            self._end_call(out, closed=False, truncated=truncated)
        elif self._plain or self._in_body:
            self._text(out, self._buf)
        self._buf = ""
        return out.items

    def _step(self, out: Deltas) -> bool:
        if self._plain:
            out.content(self._buf)
            self._buf = ""
            return False
        if not self._in_body:
            return self._read_header()
        if self._call is not None:
            return self._read_call(out)
        found = find_first(self._buf, _ENDS)
        if found is None:
            keep = len(self._buf) - held_prefix(self._buf, _ENDS)
            self._text(out, self._buf[:keep])
            self._buf = self._buf[keep:]
            return False
        at, end = found
        self._text(out, self._buf[:at])
        # <|start|> opens the next message's header: leave it there.
        self._buf = self._buf[at if end == _START else at + len(end) :]
        self._in_body = False
        return True

    def _read_call(self, out: Deltas) -> bool:
        # The arguments are JSON, so a stop tag inside one of their strings does not end them.
        assert self._call is not None
        end = self._call.feed(self._buf, out)
        if end is None:
            self._raw += self._buf
            self._buf = ""
            return False
        self._raw += self._buf[:end]
        self._buf = self._buf[end:]
        self._end_call(out, closed=True, truncated=False)
        return True

    def _read_header(self) -> bool:
        at = self._buf.find(_MESSAGE)
        if at < 0:
            start = self._buf.lstrip()
            self._plain = bool(start) and not any(
                marker.startswith(start) or start.startswith(marker) for marker in _HEADER_STARTS
            )
            return self._plain
        header = self._buf[: at + len(_MESSAGE)]
        self._buf = self._buf[at + len(_MESSAGE) :]
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        self._channel = channel.group(1) if channel else ""
        self._in_body = True
        if recipient is not None:
            name = recipient.group(1).removeprefix(_FUNCTIONS)
            # Without tools the message is content: its arguments never stream.
            reader = ArgumentsReader(self._calls, name if self._parse_tools else None)
            read = (lambda body: _call(name, body)) if self._parse_tools else _no_calls
            self._call = JsonBlock(reader, read, closes=_CALL_ENDS)
            self._raw = header
        return True

    def _text(self, out: Deltas, text: str) -> None:
        if self._channel == "analysis" and not self._plain:
            out.reasoning(text)
        else:
            out.content(text)

    def _end_call(self, out: Deltas, *, closed: bool, truncated: bool) -> None:
        """A message to a tool: a call when its body is a JSON object, else markup as content."""
        assert self._call is not None
        if not self._call.close(out, closed=closed, truncated=truncated):
            out.content(self._raw)
        self._call = None
        self._in_body = False


def _no_calls(body: str) -> None:
    return None


def _call(name: str, body: str) -> list[ParsedCall] | None:
    try:
        arguments = arguments_text(json.loads(body))
    except json.JSONDecodeError:
        return None
    return None if arguments is None else [ParsedCall(name, arguments)]


class HarmonyFormat:
    name = "harmony"
    call_example = (
        "<|channel|>commentary to=functions.<function-name> <|constrain|>json<|message|>"
        "<args-json-object><|call|>"
    )
    special_tokens_as_text = True

    def parser(
        self,
        *,
        tools: Sequence[ToolSpec],
        parse_tools: bool,
        think: bool,
        reasoning_open: bool,
        new_id: NewId,
    ) -> OutputParser:
        # The analysis channel is the reasoning: no <think> block to split.
        return HarmonyParser(parse_tools=parse_tools, new_id=new_id)

    def constraint(
        self, tools: Sequence[ToolSpec], choice: ToolChoice, parallel: bool
    ) -> StructuredOutput | str:
        # <|call|> ends the turn: one call per answer.
        return json_constraint(tools, choice, _segment, repeat=False)


def _segment(tool: ToolSpec) -> JsonSegment:
    prefix = f"<|channel|>commentary to={_FUNCTIONS}{tool.name} <|constrain|>json{_MESSAGE}"
    return JsonSegment(compact_json(parameters_schema(tool)), prefix=prefix, suffix="<|call|>")
