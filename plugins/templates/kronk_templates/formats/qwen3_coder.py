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

from kronk_core.types import StructuredOutput, ToolChoice, ToolSpec
from kronk_templates.formats.base import ParsedCall
from kronk_templates.formats.calls import compact_json
from kronk_templates.formats.constraints import allowed_tools, parameters_schema
from kronk_templates.formats.gbnf import JSON_RULES, excluding, literal
from kronk_templates.formats.markup import ClosedBlock, MarkupFormat, Opener

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
        return (
            Opener(
                "<tool_call>",
                lambda: ClosedBlock("</tool_call>", lambda body: read_call(body, properties)),
            ),
        )

    def constraint(
        self, tools: Sequence[ToolSpec], choice: ToolChoice, parallel: bool
    ) -> StructuredOutput | str:
        return grammar(allowed_tools(tools, choice), parallel)
