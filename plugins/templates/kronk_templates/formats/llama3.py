"""Llama 3.1/3.2 calls.

A whole answer of `{"name": …, "parameters": {…}}` (optionally with
`"type": "function"`; several separated by `;` or newlines), or after
`<|python_tag|>`: the same JSON, a builtin call `brave_search.call(query="…")`,
or code for the code interpreter.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

from kronk_core.contract import JsonSegment, ToolSpec
from kronk_templates.formats.base import CallWriter, ParsedCall
from kronk_templates.formats.calls import CallsReader, calls_from_values, compact_json
from kronk_templates.formats.constraints import call_schema
from kronk_templates.formats.jsonscan import json_values
from kronk_templates.formats.markup import WHITESPACE, EndBlock, JsonBlock, JsonMarkupFormat, Opener

_GAP = WHITESPACE + ";"
_BUILTIN = re.compile(r"\s*([A-Za-z_]\w*)\.call\((.*)\)\s*", re.S)


def _read_json(text: str) -> list[ParsedCall] | None:
    return calls_from_values(json_values(text, _GAP), require_arguments=True)


def _read_builtin(text: str) -> list[ParsedCall] | None:
    """`name.call(key="value", …)`: keyword arguments with Python literal values."""
    match = _BUILTIN.fullmatch(text)
    if match is None:
        return None
    try:
        call = ast.parse(f"f({match.group(2)})", mode="eval").body
        assert isinstance(call, ast.Call)
        if call.args:
            return None
        arguments = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg}
    except (SyntaxError, ValueError):
        return None
    return [ParsedCall(match.group(1), compact_json(arguments))]


class Llama3Format(JsonMarkupFormat):
    name = "llama3"
    call_example = '{"name": <function-name>, "parameters": <args-json-object>}'
    special_tokens_as_text = True
    gap = _GAP
    # Llama 3.1 calls one function per answer.
    parallel = False

    def openers(self, tools: Sequence[ToolSpec]) -> Sequence[Opener]:
        names = {tool.name for tool in tools}
        code_tool = "code_interpreter" if "code_interpreter" in names else "python"

        def read_tagged(text: str) -> list[ParsedCall] | None:
            if text.lstrip().startswith("{"):
                return _read_json(text)
            builtin = _read_builtin(text)
            if builtin is not None or not text.strip():
                return builtin
            return [ParsedCall(code_tool, compact_json({"code": text.strip()}))]

        def bare(writer: CallWriter) -> JsonBlock:
            return JsonBlock(CallsReader(writer, require_arguments=True), _read_json, "{")

        return (
            Opener("{", bare, leading=True),
            Opener("<|python_tag|>", lambda writer: EndBlock(writer, read_tagged)),
        )

    def segment(self, tool: ToolSpec) -> JsonSegment:
        return JsonSegment(call_schema(tool, "parameters"))
