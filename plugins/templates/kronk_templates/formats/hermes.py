"""Hermes-style calls (Qwen 2.5/3 and many others).

<tool_call>
{"name": …, "arguments": {…}}
</tool_call>
"""

from __future__ import annotations

from collections.abc import Sequence

from kronk_core.contract import JsonSegment, ToolSpec
from kronk_templates.formats.base import CallWriter, ParsedCall
from kronk_templates.formats.calls import CallsReader, calls_from_values
from kronk_templates.formats.constraints import call_schema
from kronk_templates.formats.jsonscan import json_values
from kronk_templates.formats.markup import JsonBlock, JsonMarkupFormat, Opener


def _read(body: str) -> list[ParsedCall] | None:
    values = json_values(body)
    if values is None or len(values) != 1:
        return None
    return calls_from_values(values, require_arguments=False)


class HermesFormat(JsonMarkupFormat):
    name = "hermes"
    call_example = (
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )

    def openers(self, tools: Sequence[ToolSpec]) -> Sequence[Opener]:
        def block(writer: CallWriter) -> JsonBlock:
            reader = CallsReader(writer, require_arguments=False)
            return JsonBlock(reader, _read, closes=("</tool_call>",))

        return (Opener("<tool_call>", block),)

    def segment(self, tool: ToolSpec) -> JsonSegment:
        return JsonSegment(call_schema(tool), prefix="<tool_call>\n", suffix="\n</tool_call>\n")
