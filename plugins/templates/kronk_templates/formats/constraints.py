"""Building forced-call constraints: which tools are allowed and their JSON schemas."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from kronk_core.contract import (
    InvalidRequestError,
    JsonSegment,
    StructuredOutput,
    ToolChoice,
    ToolSpec,
)
from kronk_templates.formats.calls import compact_json


def allowed_tools(tools: Sequence[ToolSpec], choice: ToolChoice) -> list[ToolSpec]:
    """The tools a forced call may use: all of them, or the one `choice` names."""
    if not tools:
        raise InvalidRequestError(
            "tool_choice forces a tool call but no tools were given", param="tool_choice"
        )
    if choice.mode != "function":
        return list(tools)
    named = [tool for tool in tools if tool.name == choice.name]
    if not named:
        raise InvalidRequestError(
            f"tool_choice names {choice.name!r}, which is not among the tools", param="tool_choice"
        )
    return named[:1]


def parameters_schema(tool: ToolSpec) -> dict[str, object]:
    """The tool's parameter schema; an empty one still has to be an object."""
    schema = json.loads(tool.parameters_json or "{}")
    return schema if isinstance(schema, dict) and schema else {"type": "object"}


def call_schema(tool: ToolSpec, arguments_key: str = "arguments") -> str:
    """`{"name": NAME, <arguments_key>: {…}}` with the name pinned, as JSON text."""
    return compact_json(
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, arguments_key: parameters_schema(tool)},
            "required": ["name", arguments_key],
        }
    )


def json_constraint(
    tools: Sequence[ToolSpec],
    choice: ToolChoice,
    segment: Callable[[ToolSpec], JsonSegment],
    *,
    repeat: bool,
) -> StructuredOutput:
    return StructuredOutput(
        tuple(segment(tool) for tool in allowed_tools(tools, choice)), repeat=repeat
    )
