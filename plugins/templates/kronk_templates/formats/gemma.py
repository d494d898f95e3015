"""The default model's calls: a bare `{"name": …, "arguments": {…}}` answer.

Several objects one per line, a JSON array of them, or either inside a
```json / ```tool_code fence. Only an answer that starts (after whitespace)
with one of these is read as calls, and only when every object has a call's shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kronk_core.contract import JsonSegment, ToolSpec
from kronk_templates.formats.base import CallWriter, ParsedCall
from kronk_templates.formats.calls import CallsReader, calls_from_values
from kronk_templates.formats.constraints import call_schema
from kronk_templates.formats.jsonscan import json_values
from kronk_templates.formats.markup import JsonBlock, JsonMarkupFormat, Opener


def read_calls(text: str) -> list[ParsedCall] | None:
    return calls_from_values(json_values(text), require_arguments=True)


class GemmaFormat(JsonMarkupFormat):
    name = "gemma"
    call_example = '{"name": <function-name>, "arguments": <args-json-object>}'

    def openers(self, tools: Sequence[ToolSpec]) -> Sequence[Opener]:
        def bare(lead: str) -> Callable[[CallWriter], JsonBlock]:
            return lambda writer: JsonBlock(
                CallsReader(writer, require_arguments=True), read_calls, lead
            )

        def fenced(writer: CallWriter) -> JsonBlock:
            reader = CallsReader(writer, require_arguments=True)
            return JsonBlock(reader, read_calls, closes=("```",), many=True)

        return (
            Opener("{", bare("{"), leading=True),
            Opener("[", bare("["), leading=True),
            Opener("```json", fenced, leading=True),
            Opener("```tool_code", fenced, leading=True),
        )

    def segment(self, tool: ToolSpec) -> JsonSegment:
        return JsonSegment(call_schema(tool), suffix="\n")
