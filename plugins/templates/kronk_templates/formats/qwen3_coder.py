"""Qwen3-Coder XML calls.

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    value
    </parameter>
    </function>
    </tool_call>

Values are raw text; the tool's schema says which to decode, following the
reference parser Qwen ships with the model (qwen3coder_tool_parser.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from kronk_core.contract import StructuredOutput, ToolChoice, ToolSpec
from kronk_templates.formats.base import CallWriter, Deltas, ParsedCall
from kronk_templates.formats.calls import compact_json
from kronk_templates.formats.constraints import allowed_tools, parameters_schema
from kronk_templates.formats.grammar_pieces import JSON_RULES, excluding, literal
from kronk_templates.formats.jsonstream import string_body
from kronk_templates.formats.markup import MarkupFormat, Opener
from kronk_templates.formats.text import find_first, held_prefix

Properties = Mapping[str, Any]

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)(?:</function>\s*)?", re.S)
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>")
_PARAMETER_END = re.compile(r"</parameter>|(?=<parameter=)|\Z")
_STRING_TYPES = {"string", "str", "text", "varchar", "char", "enum"}
_INT_PREFIXES = ("int", "uint", "long", "short", "unsigned")


def _type(schema: object) -> str:
    """The schema's type as the reference parser reads it; no type means string."""
    kind = schema.get("type", "string") if isinstance(schema, dict) else "string"
    return str(kind).strip().lower()


def _convert(value: str, schema: object | None) -> object:
    """A parameter's value: null, then by the schema's type; undecodable values stay strings."""
    if value.lower() == "null":
        return None
    kind = _type(schema) if schema is not None else "string"
    if kind in _STRING_TYPES:
        return value
    if kind.startswith(_INT_PREFIXES):
        try:
            return int(value)
        except ValueError:
            return value
    if kind.startswith(("num", "float")):
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if number.is_integer() else number
    if kind in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _trim(value: str) -> str:
    """Drop the newline after the opening tag and the one before the closing tag."""
    value = value.removeprefix("\n")
    return value.removesuffix("\n")


def read_call(body: str, properties: Mapping[str, Properties]) -> list[ParsedCall] | None:
    function = _FUNCTION.fullmatch(body)
    if function is None:
        return None
    name, rest = function.group(1).strip(), function.group(2)
    schema = properties.get(name, {})
    arguments: dict[str, object] = {}
    at = 0
    while rest[at:].strip():
        opening = _PARAMETER.match(rest, at)
        if opening is None:
            return None
        end = _PARAMETER_END.search(rest, opening.end())
        assert end is not None  # \Z always matches
        key = opening.group(1).strip()
        arguments[key] = _convert(_trim(rest[opening.end() : end.start()]), schema.get(key))
        at = end.end()
    return [ParsedCall(name, compact_json(arguments))]


_CLOSE = "</tool_call>"
_FUNCTION_OPEN = re.compile(r"\s*<function=([^>\n]+)>")
_FUNCTION_END = re.compile(r"</function>\s*\Z")
_VALUE_ENDS = ("</parameter>", "<parameter=")
# Text at the end of a value that may still grow into its end (kept back meanwhile).
_VALUE_HELD = (*_VALUE_ENDS, "</function>")


class Qwen3CoderBlock:
    """A call up to `</tool_call>`, streamed: its name once `<function=NAME>` is read, then
    its arguments as JSON, each string value as it is written, other values once they end.

    The arguments are the compact JSON `read_call` makes of the whole call;
    text that is no parameter after the function tag ends the call there.
    """

    def __init__(self, writer: CallWriter, properties: Mapping[str, Properties]) -> None:
        self._writer = writer
        self._properties = properties
        self._schema: Properties = {}
        self._text = ""  # the body so far, for read_call when no call started
        self._fed = 0  # how much of it went to _pending
        self._pending = ""  # body text not yet read
        self._started = False
        self._over = False  # the call ended (or broke)
        self._first = True  # no parameter written yet
        self._key: str | None = None  # the parameter whose value is being read
        self._value = ""  # its raw value so far
        self._written: int | None = None  # how much of a string value went out (None: nothing)

    def feed(self, text: str, out: Deltas) -> int | None:
        before = len(self._text)
        self._text += text
        end = self._text.find(_CLOSE, max(0, before - len(_CLOSE) + 1))
        if end >= 0:
            self._text = self._text[:end]
        # Hold what may be the start of `</tool_call>` until it is decided.
        safe = len(self._text) - (held_prefix(self._text, (_CLOSE,)) if end < 0 else 0)
        self._pending += self._text[self._fed : safe]
        self._fed = max(self._fed, safe)
        self._read(out, final=False)
        return None if end < 0 else end + len(_CLOSE) - before

    def close(self, out: Deltas, *, closed: bool, truncated: bool) -> bool:
        if not self._started:
            calls = None if truncated else read_call(self._text, self._properties)
            for call in calls or ():
                self._writer.whole(out, call)
            return calls is not None
        if not truncated:
            self._pending += self._text[self._fed :]
            self._read(out, final=True)
        self._end(out)
        return True

    def _read(self, out: Deltas, *, final: bool) -> None:
        while not self._over:
            if not self._started:
                opening = _FUNCTION_OPEN.match(self._pending)
                if opening is None:
                    return
                name = opening.group(1).strip()
                self._schema = self._properties.get(name, {})
                self._writer.start(out, name)
                self._writer.arguments(out, "{")
                self._started = True
                self._pending = self._pending[opening.end() :]
            elif self._key is None:
                if not self._next_parameter(out, final=final):
                    return
            elif not self._read_value(out, final=final):
                return

    def _next_parameter(self, out: Deltas, *, final: bool) -> bool:
        opening = _PARAMETER.match(self._pending)
        if opening is not None:
            self._key = opening.group(1).strip()
            self._value, self._written = "", None
            self._pending = self._pending[opening.end() :]
            return True
        rest = self._pending.lstrip()
        if not rest or _FUNCTION_END.match(rest):
            return False
        if not final and any(tag.startswith(rest[: len(tag)]) for tag in _TAGS):
            return False
        self._end(out)  # text that is no parameter: the call ends before it
        return False

    def _read_value(self, out: Deltas, *, final: bool) -> bool:
        self._value += self._pending
        self._pending = ""
        found = find_first(self._value, _VALUE_ENDS)
        if found is not None:
            at, end = found
            raw = self._value[:at]
            self._pending = self._value[at + len(end) if end == "</parameter>" else at :]
        elif final:
            function_end = _FUNCTION_END.search(self._value)
            raw = self._value[: function_end.start()] if function_end else self._value
        else:
            self._stream_string(out)
            return False
        self._write_value(out, _trim(raw))
        self._key = None
        return True

    def _is_string(self) -> bool:
        assert self._key is not None
        schema = self._schema.get(self._key)
        return schema is None or _type(schema) in _STRING_TYPES

    def _stream_string(self, out: Deltas) -> None:
        """Write what is certain of a string value: not `null`, not the newline before its end."""
        if not self._is_string() or not self._value:
            return
        body = self._value.removeprefix("\n")
        function_end = _FUNCTION_END.search(body)
        safe = function_end.start() if function_end else len(body) - held_prefix(body, _VALUE_HELD)
        safe -= body[:safe].endswith("\n")
        if self._written is None:
            if "null".startswith(body[:safe].lower()):
                return
            self._writer.arguments(out, self._member_head() + '"')
            self._written = 0
        self._writer.arguments(out, string_body(body[self._written : safe]))
        self._written = max(self._written, safe)

    def _write_value(self, out: Deltas, value: str) -> None:
        if self._written is not None:
            self._writer.arguments(out, string_body(value[self._written :]) + '"')
            self._written = None
            return
        assert self._key is not None
        converted = _convert(value, self._schema.get(self._key))
        self._writer.arguments(out, self._member_head() + compact_json(converted))

    def _member_head(self) -> str:
        head = ("" if self._first else ",") + json.dumps(self._key, ensure_ascii=False) + ":"
        self._first = False
        return head

    def _end(self, out: Deltas) -> None:
        """End the call: a string value that went out in part is closed as it stands."""
        if self._over:
            return
        self._over = True
        self._writer.arguments(out, ('"' if self._written is not None else "") + "}")
        self._writer.end(out)


_TAGS = ("<parameter=", "</function>")


def _properties(tool: ToolSpec) -> Properties:
    properties = parameters_schema(tool).get("properties")
    return properties if isinstance(properties, dict) else {}


def _value_rule(schema: object) -> str:
    """A GBNF expression for one parameter value as the model writes it (strings raw)."""
    kind = _type(schema)
    enum = schema.get("enum") if isinstance(schema, dict) else None
    if kind in _STRING_TYPES:
        if isinstance(enum, list) and enum:
            return "( " + " | ".join(literal(str(option)) for option in enum) + " )"
        return "text-0"
    if kind == "integer":
        return "json-int"
    if kind == "number":
        return "json-number"
    if kind == "boolean":
        return '( "true" | "false" )'
    return "json-value"


def grammar(tools: Sequence[ToolSpec], parallel: bool) -> str:
    """GBNF for one call (or several, one per line) of `tools`, parameters in schema order."""
    rules: list[str] = []
    functions: list[str] = []
    for index, tool in enumerate(tools):
        required = parameters_schema(tool).get("required")
        needed = required if isinstance(required, list) else []
        parameters: list[str] = []
        for key, schema in _properties(tool).items():
            rule = f"param-{index}-{len(parameters)}"
            opening, closing = literal(f"<parameter={key}>\n"), literal("\n</parameter>\n")
            rules.append(f"{rule} ::= {opening} {_value_rule(schema)} {closing}")
            parameters.append(rule if key in needed else f"{rule}?")
        opening, closing = literal(f"<function={tool.name}>\n"), literal("</function>\n")
        rules.append(f"function-{index} ::= {opening} {' '.join(parameters)} {closing}")
        functions.append(f"function-{index}")
    call = f'call ::= "<tool_call>\\n" ( {" | ".join(functions)} ) "</tool_call>"'
    root = 'root ::= call ( "\\n" call )*' if parallel else "root ::= call"
    return "\n".join([root, call, *rules, excluding("text", "</parameter>"), JSON_RULES]) + "\n"


class Qwen3CoderFormat(MarkupFormat):
    name = "qwen3_coder"
    call_example = (
        "<tool_call>\n<function=<function-name>>\n<parameter=<parameter-name>>\n<value>\n"
        "</parameter>\n</function>\n</tool_call>"
    )

    def openers(self, tools: Sequence[ToolSpec]) -> Sequence[Opener]:
        properties = {tool.name: _properties(tool) for tool in tools}
        return (Opener("<tool_call>", lambda writer: Qwen3CoderBlock(writer, properties)),)

    def constraint(
        self, tools: Sequence[ToolSpec], choice: ToolChoice, parallel: bool
    ) -> StructuredOutput | str:
        return grammar(allowed_tools(tools, choice), parallel)
