"""The Responses dialect's rules without a model: which fields are ignored, logged or
refused; how namespace, custom and built-in tools are offered or left out; how the input
items of other tools' calls become the conversation; the events of a custom tool's call and
of a failure."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from kronk_core.contract.errors import ContextOverflowError
from kronk_core.contract.types import ChatDelta, ChatMessage, ToolCall, ToolCallDelta
from kronk_openai.responses.answers import ResponseBuilder
from kronk_openai.responses.schemas import FIELDS, ResponsesRequest, ToolTarget

NAMESPACE = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Sub-agents.",
    "tools": [
        {"type": "function", "name": "close_agent", "parameters": {"type": "object"}},
        {"type": "custom", "name": "note"},
    ],
}
PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: LINE+"},
}


def _request(**body: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "hi", **body})


def test_field_rules() -> None:
    body = {"prompt_cache_key": "k", "include": [], "frobnicate": 1, "store": False}
    request = _request(**body)
    assert FIELDS.unknown(request.model_extra or {}) == ["frobnicate"]
    for name, fragment in (
        ("prompt", "stored prompt templates are not supported"),
        ("background", "background responses are not supported"),
        ("conversation", "use previous_response_id"),
    ):
        with pytest.raises(ValidationError, match=f"{name}: .*{fragment}"):
            _request(**{name: {"id": "x"} if name != "background" else True})
    # Asking for nothing is not asking.
    assert _request(background=False, conversation=None).model_extra == {
        "background": False,
        "conversation": None,
    }


def test_tools_are_offered_by_kind() -> None:
    tools = [
        {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
        NAMESPACE,
        PATCH,
        {"type": "web_search", "external_web_access": False},
        {"type": "local_shell"},
    ]
    plan = _request(tools=tools).tool_plan()
    assert [spec.name for spec in plan.specs] == [
        "exec_command",
        "multi_agent_v1.close_agent",
        "multi_agent_v1.note",
        "apply_patch",
    ]
    assert plan.omitted == ("web_search", "local_shell")
    assert plan.targets["multi_agent_v1.close_agent"] == ToolTarget("close_agent", "multi_agent_v1")
    assert plan.targets["apply_patch"] == ToolTarget("apply_patch", None, custom=True)
    assert plan.specs[1].description.startswith("(multi_agent_v1: Sub-agents.)")
    patch = json.loads(plan.specs[3].parameters_json)
    assert patch["required"] == ["input"]
    assert "lark grammar:\nstart: LINE+" in patch["properties"]["input"]["description"]
    forced = _request(tools=tools, tool_choice={"type": "custom", "name": "apply_patch"})
    assert forced.choice().name == "apply_patch"
    namespaced = {"type": "function", "name": "close_agent", "namespace": "multi_agent_v1"}
    assert _request(tool_choice=namespaced).choice().name == "multi_agent_v1.close_agent"


def test_other_tools_calls_in_the_input_become_the_conversation() -> None:
    items = [
        {"role": "user", "content": "Go."},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Plan."}]},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "close_agent",
            "namespace": "multi_agent_v1",
            "arguments": '{"target": "a"}',
        },
        {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** x"},
        {
            "type": "local_shell_call",
            "id": "lsh_1",
            "call_id": "c3",
            "status": "completed",
            "action": {"type": "exec", "command": ["ls"]},
        },
        {"type": "function_call_output", "call_id": "c1", "output": "closed"},
        {
            "type": "custom_tool_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "patched"}],
        },
        {"type": "local_shell_call_output", "id": "c3", "output": "a.txt"},
        {"type": "shell_call_output", "call_id": "c4", "output": [{"stdout": "x"}]},
        {"type": "compaction", "encrypted_content": "opaque"},
        {"type": "web_search_call", "id": "ws_1", "action": {"type": "search", "query": "q"}},
    ]
    messages = _request(input=items).input_messages()
    assert messages == [
        ChatMessage(role="user", content="Go."),
        ChatMessage(
            role="assistant",
            tool_calls=(
                ToolCall("c1", "multi_agent_v1.close_agent", '{"target": "a"}'),
                ToolCall("c2", "apply_patch", '{"input": "*** x"}'),
                ToolCall("c3", "local_shell", '{"action": {"type": "exec", "command": ["ls"]}}'),
            ),
            reasoning_content="Plan.",
        ),
        ChatMessage(role="tool", content="closed", tool_call_id="c1"),
        ChatMessage(role="tool", content="patched", tool_call_id="c2"),
        ChatMessage(role="tool", content="a.txt", tool_call_id="c3"),
        ChatMessage(role="tool", content='[{"stdout": "x"}]', tool_call_id="c4"),
    ]


@pytest.mark.parametrize(
    ("item", "fragment"),
    [
        ({"type": "nope"}, "input"),
        ({"type": "mcp_call", "id": "m", "name": "x"}, "call_id"),
        ({"type": "custom_tool_call_output", "output": "x"}, "needs the call_id"),
    ],
)
def test_items_that_cannot_be_read_are_refused(item: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        _request(input=[item])


def test_a_custom_tool_call_streams_as_one() -> None:
    targets = {"apply_patch": ToolTarget("apply_patch", "tools", custom=True)}
    builder = ResponseBuilder({"id": "resp_1"}, targets)
    call = ToolCall("call_1", "apply_patch", '{"input":"*** Begin"}')
    events = builder.feed(
        ChatDelta(tool_call_deltas=(ToolCallDelta("call_1", "apply_patch", '{"input":"*'),))
    )
    events += builder.feed(ChatDelta(tool_calls=(call,)))
    assert [name for name, _ in events] == [
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
    ]
    added, done = events[0][1]["item"], events[-1][1]["item"]
    assert added["input"] == "" and added["status"] == "in_progress"
    assert {key: done[key] for key in ("type", "call_id", "name", "namespace", "input")} == {
        "type": "custom_tool_call",
        "call_id": "call_1",
        "name": "apply_patch",
        "namespace": "tools",
        "input": "*** Begin",
    }
    # The stored conversation keeps the call as the model made it.
    assert builder.assistant_message().tool_calls == (call,)


def test_a_failure_ends_the_response() -> None:
    builder = ResponseBuilder({"id": "resp_1"})
    overflow = ContextOverflowError("needs 9000 tokens", prompt_tokens=8999, context_window=4096)
    (error_name, error), (failed_name, failed) = builder.error(overflow)
    assert (error_name, failed_name) == ("error", "response.failed")
    assert error["code"] == "context_length_exceeded"
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {
        "code": "context_length_exceeded",
        "message": "Your input exceeds the context window of this model: needs 9000 tokens",
    }
