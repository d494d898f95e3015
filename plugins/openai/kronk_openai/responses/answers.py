"""Chat deltas → a Responses API response: its output items and its stream of named events."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from kronk_core.contract import (
    ChatDelta,
    ChatMessage,
    FinishReason,
    KronkError,
    ServerToolUse,
    ToolCall,
    ToolCallDelta,
    ToolLoopEvent,
    Usage,
)
from kronk_openai.responses.errors import RESPONSES_ERRORS
from kronk_openai.responses.schemas import ToolTarget

Event = tuple[str, dict[str, Any]]


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage_dict(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


@dataclass
class _OpenItem:
    """The reasoning or message item being streamed; its text grows with each delta."""

    kind: str  # "reasoning" | "message"
    item_id: str
    output_index: int
    parts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.parts)


class ResponseBuilder:
    """Feed it the deltas of one generation; it returns the events to stream and
    builds the final response object (non-streaming callers ignore the events)."""

    def __init__(
        self, skeleton: dict[str, Any], targets: Mapping[str, ToolTarget] | None = None
    ) -> None:
        self.response: dict[str, Any] = {
            **skeleton,
            "object": "response",
            "created_at": int(time.time()),
            # When the response completed (unix seconds), as OpenAI reports it; null until then.
            "completed_at": None,
            "status": "in_progress",
            "output": [],
            "usage": None,
            "error": None,
            "incomplete_details": None,
        }
        self._sequence = 0
        self._open: _OpenItem | None = None
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[ToolCall] = []
        self._call_items: dict[str, int] = {}  # the output index of each call still streaming
        self._searches: dict[str, int] = {}  # the output index of each server-run web search
        # What each function the model sees stands for (namespaced and custom tools).
        self._targets = targets or {}

    @property
    def output(self) -> list[dict[str, Any]]:
        output: list[dict[str, Any]] = self.response["output"]
        return output

    def _event(self, kind: str, /, **payload: Any) -> Event:
        self._sequence += 1
        return kind, {"type": kind, "sequence_number": self._sequence, **payload}

    def start(self) -> list[Event]:
        return [
            self._event("response.created", response=self._snapshot()),
            self._event("response.in_progress", response=self._snapshot()),
        ]

    def _snapshot(self) -> dict[str, Any]:
        return {**self.response, "output": list(self.output)}

    @staticmethod
    def ends(event: ToolLoopEvent) -> TypeGuard[ChatDelta]:
        """Whether `event` is the last delta, which `finish` takes."""
        return isinstance(event, ChatDelta) and event.finish_reason is not None

    def feed(self, delta: ToolLoopEvent) -> list[Event]:
        if isinstance(delta, ServerToolUse):
            return self._web_search(delta)
        events: list[Event] = []
        if delta.reasoning:
            events += self._text("reasoning", delta.reasoning)
        if delta.content:
            events += self._text("message", delta.content)
        for piece in delta.tool_call_deltas:
            events += self._function_call_piece(piece)
        for call in delta.tool_calls:
            events += self._function_call_done(call)
        return events

    def finish(self, delta: ChatDelta) -> list[Event]:
        """The last delta (finish_reason and usage) closes the response."""
        incomplete = delta.finish_reason is FinishReason.length
        events = self._close(incomplete=incomplete)
        assert delta.usage is not None
        self.response["usage"] = usage_dict(delta.usage)
        if incomplete:
            self.response["status"] = "incomplete"
            self.response["incomplete_details"] = {"reason": "max_output_tokens"}
            return [*events, self._event("response.incomplete", response=self._snapshot())]
        self.response["status"] = "completed"
        self.response["completed_at"] = int(time.time())
        return [*events, self._event("response.completed", response=self._snapshot())]

    def error(self, error: KronkError) -> list[Event]:
        """A failure: the `error` event, then `response.failed`, which ends the response
        (Codex reads the failure from it, other clients from `error`)."""
        message = RESPONSES_ERRORS.message(error)
        return [
            self._event("error", code=error.code, message=message, param=error.param),
            *self.failed(error.code, message),
        ]

    def failed(self, code: str, message: str) -> list[Event]:
        self.response["status"] = "failed"
        self.response["error"] = {"code": code, "message": message}
        return [self._event("response.failed", response=self._snapshot())]

    def assistant_message(self) -> ChatMessage:
        """The output as the assistant turn of a stored conversation."""
        return ChatMessage(
            role="assistant",
            content="".join(self._content) or None,
            tool_calls=tuple(self._calls),
            reasoning_content="".join(self._reasoning) or None,
        )

    # ---- items ---------------------------------------------------------------

    def _text(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if self._open is None or self._open.kind != kind:
            events += self._close()
            events += self._open_item(kind)
        assert self._open is not None
        self._open.parts.append(text)
        (self._reasoning if kind == "reasoning" else self._content).append(text)
        where = {**self._where(), "content_index": 0, "delta": text}
        if kind == "reasoning":
            events.append(self._event("response.reasoning_text.delta", **where))
        else:
            events.append(self._event("response.output_text.delta", **where, logprobs=[]))
        return events

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open.item_id, "output_index": self._open.output_index}

    def _open_item(self, kind: str) -> list[Event]:
        prefix = "rs" if kind == "reasoning" else "msg"
        self._open = _OpenItem(kind, _item_id(prefix), len(self.output))
        item = self._item(self._open, "in_progress", empty=True)
        self.output.append(item)
        events = [
            self._event("response.output_item.added", output_index=len(self.output) - 1, item=item)
        ]
        if kind == "message":
            events.append(
                self._event(
                    "response.content_part.added",
                    **self._where(),
                    content_index=0,
                    part=self._part(self._open, empty=True),
                )
            )
        return events

    def _part(self, item: _OpenItem, *, empty: bool = False) -> dict[str, Any]:
        text = "" if empty else item.text
        if item.kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _item(self, item: _OpenItem, status: str, *, empty: bool = False) -> dict[str, Any]:
        content = [] if empty else [self._part(item)]
        if item.kind == "reasoning":
            return {
                "type": "reasoning",
                "id": item.item_id,
                "summary": [],
                "content": content,
                "status": status,
            }
        return {
            "type": "message",
            "id": item.item_id,
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def _close(self, *, incomplete: bool = False) -> list[Event]:
        item = self._open
        if item is None:
            return []
        self._open = None
        where = {"item_id": item.item_id, "output_index": item.output_index}
        done = self._item(item, "incomplete" if incomplete else "completed")
        self.output[item.output_index] = done
        if item.kind == "reasoning":
            events = [
                self._event(
                    "response.reasoning_text.done", **where, content_index=0, text=item.text
                )
            ]
        else:
            events = [
                self._event(
                    "response.output_text.done",
                    **where,
                    content_index=0,
                    text=item.text,
                    logprobs=[],
                ),
                self._event(
                    "response.content_part.done", **where, content_index=0, part=self._part(item)
                ),
            ]
        return [
            *events,
            self._event("response.output_item.done", output_index=item.output_index, item=done),
        ]

    def _web_search(self, use: ServerToolUse) -> list[Event]:
        """A search Kronk runs: its web_search_call item is added and searching, then done.

        The text and calls before it went into the conversation as the loop's own turn, so
        the stored assistant message starts anew after it.
        """
        if use.result is None:
            events = self._close()
            self._content, self._reasoning, self._calls = [], [], []
            query = use.arguments.get("query")
            action = {"type": "search", "query": query if isinstance(query, str) else ""}
            item: dict[str, Any] = {
                "type": "web_search_call",
                "id": _item_id("ws"),
                "status": "in_progress",
                "action": action,
            }
            index = self._searches[use.call.id] = len(self.output)
            self.output.append(item)
            where = {"item_id": item["id"], "output_index": index}
            return [
                *events,
                self._event("response.output_item.added", output_index=index, item=item),
                self._event("response.web_search_call.in_progress", **where),
                self._event("response.web_search_call.searching", **where),
            ]
        index = self._searches.pop(use.call.id)
        item = self.output[index]
        sources = [{"type": "url", "url": source.url} for source in use.result.sources]
        self.output[index] = done = {
            **item,
            "status": "failed" if use.result.error else "completed",
            "action": {**item["action"], "sources": sources},
        }
        where = {"item_id": item["id"], "output_index": index}
        return [
            self._event("response.web_search_call.completed", **where),
            self._event("response.output_item.done", output_index=index, item=done),
        ]

    def _function_call_piece(self, piece: ToolCallDelta) -> list[Event]:
        """A call's first piece adds its item; every piece of a function's call streams its
        arguments' fragment (a custom tool's input comes whole, when the call ends)."""
        events: list[Event] = []
        if piece.name is not None:
            events += self._close()
            target = self._targets.get(piece.name, ToolTarget(piece.name))
            item: dict[str, Any] = {
                "type": "custom_tool_call" if target.custom else "function_call",
                "id": _item_id("ctc" if target.custom else "fc"),
                "call_id": piece.id,
                "name": target.name,
            }
            if target.namespace is not None:
                item["namespace"] = target.namespace
            item.update({"input": ""} if target.custom else {"arguments": ""})
            item["status"] = "in_progress"
            index = self._call_items[piece.id] = len(self.output)
            self.output.append(item)
            events.append(self._event("response.output_item.added", output_index=index, item=item))
        index = self._call_items[piece.id]
        if piece.arguments and self.output[index]["type"] == "function_call":
            where = {"item_id": self.output[index]["id"], "output_index": index}
            kind = "response.function_call_arguments.delta"
            events.append(self._event(kind, **where, delta=piece.arguments))
        return events

    def _function_call_done(self, call: ToolCall) -> list[Event]:
        self._calls.append(call)
        index = self._call_items.pop(call.id)
        item = self.output[index]
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "custom_tool_call":
            text = _custom_input(call.arguments)
            self.output[index] = done = {**item, "input": text, "status": "completed"}
            events = [
                self._event("response.custom_tool_call_input.delta", **where, delta=text),
                self._event("response.custom_tool_call_input.done", **where, input=text),
            ]
        else:
            done = {**item, "arguments": call.arguments, "status": "completed"}
            self.output[index] = done
            events = [
                self._event(
                    "response.function_call_arguments.done",
                    **where,
                    name=item["name"],
                    arguments=call.arguments,
                )
            ]
        return [*events, self._event("response.output_item.done", output_index=index, item=done)]


def _custom_input(arguments: str) -> str:
    """A custom tool's free text: the `input` its function was called with (a model that
    wrote other arguments gets them as the text)."""
    value = json.loads(arguments).get("input")
    return value if isinstance(value, str) else arguments
