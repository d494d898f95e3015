"""The default model's calls: a bare `{"name": …, "arguments": {…}}` answer.

Several objects one per line, a JSON array of them, or either inside a
```json / ```tool_code fence. Only an answer that starts (after whitespace)
with one of these is read as calls, and only when every object has a call's shape.
"""

from __future__ import annotations

from collections.abc import Sequence

from kronk_core.types import JsonSegment, ToolSpec
from kronk_templates.formats.base import ParsedCall
from kronk_templates.formats.calls import calls_from_values
from kronk_templates.formats.constraints import call_schema
from kronk_templates.formats.jsonscan import json_values
from kronk_templates.formats.markup import ClosedBlock, JsonBlock, JsonMarkupFormat, Opener


def read_calls(text: str) -> list[ParsedCall] | None:
    return calls_from_values(json_values(text), require_arguments=True)


class GemmaFormat(JsonMarkupFormat):
    name = "gemma"
    call_example = '{"name": <function-name>, "arguments": <args-json-object>}'

    def openers(self, tools: Sequence[ToolSpec]) -> Sequence[Opener]:
        return (
            Opener("{", lambda: JsonBlock(read_calls, "{"), leading=True),
            Opener("[", lambda: JsonBlock(read_calls, "["), leading=True),
            Opener("```json", lambda: ClosedBlock("```", read_calls), leading=True),
            Opener("```tool_code", lambda: ClosedBlock("```", read_calls), leading=True),
        )

    def segment(self, tool: ToolSpec) -> JsonSegment:
        return JsonSegment(call_schema(tool), suffix="\n")
