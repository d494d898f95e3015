"""Mistral calls, in both generations of the markup.

    [TOOL_CALLS][{"name": …, "arguments": {…}, "id": …}, …]     (Mistral 7B v0.3, Nemo)
    [TOOL_CALLS]NAME[ARGS]{…}  or  NAME[CALL_ID]ID[ARGS]{…}     (Small 3.x, Magistral, Devstral)

Mistral templates require tool-call ids of 9 letters or digits: the model's own
when it wrote one, else the first 9 hex digits of SHA-256 of `new_id()`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence

from kronk_core.contract import JsonSegment, StructuredOutput, ToolChoice, ToolSpec
from kronk_templates.formats.base import CallWriter, Deltas, NewId, ParsedCall
from kronk_templates.formats.calls import (
    ArgumentsReader,
    CallsReader,
    JsonReader,
    arguments_text,
    calls_from_values,
    compact_json,
)
from kronk_templates.formats.constraints import allowed_tools, call_schema, parameters_schema
from kronk_templates.formats.jsonscan import json_values
from kronk_templates.formats.markup import JsonBlock, JsonMarkupFormat, Opener

_ID = re.compile(r"[A-Za-z0-9]{9}")
_NAMED = re.compile(r"\s*([^\s\[\]]+)(?:\[CALL_ID\]([^\[]*))?\[ARGS\](.*)", re.S)
_HEAD = re.compile(r"\s*([^\s\[\]]+)(?:\[CALL_ID\]([^\[]*))?\[ARGS\]", re.S)


def _valid_id(call_id: str) -> bool:
    return _ID.fullmatch(call_id) is not None


def _own_id(call: ParsedCall) -> ParsedCall:
    """Keep the model's id only when the templates will accept it back."""
    if call.id is not None and _ID.fullmatch(call.id):
        return call
    return ParsedCall(call.name, call.arguments)


def read_calls(text: str) -> list[ParsedCall] | None:
    if text.lstrip().startswith("["):
        calls = calls_from_values(json_values(text), require_arguments=False)
        return None if calls is None else [_own_id(call) for call in calls]
    named = _NAMED.fullmatch(text)
    if named is None:
        return None
    try:
        arguments = arguments_text(json.loads(named.group(3)))
    except json.JSONDecodeError:
        return None
    if arguments is None:
        return None
    return [_own_id(ParsedCall(named.group(1), arguments, named.group(2)))]


class MistralBlock:
    """After [TOOL_CALLS]: a JSON array, or a name and [ARGS] then a JSON object."""

    def __init__(self, writer: CallWriter) -> None:
        self._writer = writer
        self._head = ""  # the text before the JSON
        self._json: JsonBlock | None = None

    def feed(self, text: str, out: Deltas) -> int | None:
        if self._json is not None:
            return self._json.feed(text, out)
        before = len(self._head)
        self._head += text
        head = self._head.lstrip()
        if not head:
            return None
        if head.startswith("["):
            start = len(self._head) - len(head)
            reader: JsonReader = CallsReader(
                self._writer, require_arguments=False, own_id=_valid_id
            )
        else:
            args = self._head.find("[ARGS]")
            if args < 0:
                return None
            start = args + len("[ARGS]")
            named = _HEAD.fullmatch(self._head[:start])
            call_id = named and named.group(2)
            reader = ArgumentsReader(
                self._writer,
                named and named.group(1),
                call_id if call_id and _valid_id(call_id) else None,
            )
        head_text = self._head[:start]
        self._head = head_text
        self._json = JsonBlock(reader, lambda json: read_calls(head_text + json))
        end = self._json.feed(text[start - before :], out)
        return None if end is None else start - before + end

    def close(self, out: Deltas, *, closed: bool, truncated: bool) -> bool:
        if self._json is not None:
            return self._json.close(out, closed=closed, truncated=truncated)
        calls = None if truncated else read_calls(self._head)
        for call in calls or ():
            self._writer.whole(out, call)
        return calls is not None


class MistralFormat(JsonMarkupFormat):
    """`array_calls`: the model writes (and is forced into) the JSON-array form."""

    special_tokens_as_text = True
    think_tags = ("[THINK]", "[/THINK]")

    def __init__(self, name: str, *, array_calls: bool) -> None:
        self.name = name
        self._array_calls = array_calls
        self.call_example = (
            '[TOOL_CALLS][{"name": <function-name>, "arguments": <args-json-object>}]'
            if array_calls
            else "[TOOL_CALLS]<function-name>[ARGS]<args-json-object>"
        )

    def openers(self, tools: Sequence[ToolSpec]) -> Sequence[Opener]:
        return (Opener("[TOOL_CALLS]", MistralBlock),)

    def ids(self, new_id: NewId) -> NewId:
        return lambda: hashlib.sha256(new_id().encode()).hexdigest()[:9]

    def segment(self, tool: ToolSpec) -> JsonSegment:
        return JsonSegment(
            compact_json(parameters_schema(tool)), prefix=f"[TOOL_CALLS]{tool.name}[ARGS]"
        )

    def constraint(
        self, tools: Sequence[ToolSpec], choice: ToolChoice, parallel: bool
    ) -> StructuredOutput | str:
        if not self._array_calls:
            return super().constraint(tools, choice, parallel)
        calls = [json.loads(call_schema(tool)) for tool in allowed_tools(tools, choice)]
        schema: dict[str, object] = {
            "type": "array",
            "items": calls[0] if len(calls) == 1 else {"anyOf": calls},
            "minItems": 1,
        }
        if not parallel:
            schema["maxItems"] = 1
        return StructuredOutput((JsonSegment(compact_json(schema), prefix="[TOOL_CALLS]"),))
