"""Core results → Anthropic message objects and content-block events (plain dicts for JSON)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from kronk_core.contract import (
    ChatDelta,
    FinishReason,
    ServerToolResult,
    ServerToolUse,
    ToolCallDelta,
    ToolError,
    ToolLoopEvent,
    Usage,
)

Event = tuple[str, dict[str, Any]]

_STOP_REASONS = {
    FinishReason.length: "max_tokens",
    FinishReason.tool_calls: "tool_use",
}


def stop_reason(delta: ChatDelta) -> str:
    if delta.stop_sequence is not None:
        return "stop_sequence"
    assert delta.finish_reason is not None
    return _STOP_REASONS.get(delta.finish_reason, "end_turn")


# The error codes of a web_search_tool_result_error, by the server tool's error.
_SEARCH_ERRORS: dict[ToolError, str] = {
    "invalid_input": "invalid_tool_input",
    "unavailable": "unavailable",
    "rate_limited": "too_many_requests",
    "max_uses_exceeded": "max_uses_exceeded",
}


def usage_dict(usage: Usage, web_searches: int | None = None) -> dict[str, Any]:
    """Anthropic counts cache reads apart: input + cache_creation + cache_read = whole prompt.
    With web search served, the searches run are `server_tool_use.web_search_requests`."""
    counts: dict[str, Any] = {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"thinking_tokens": usage.reasoning_tokens},
    }
    if web_searches is not None:
        counts["server_tool_use"] = {"web_search_requests": web_searches, "web_fetch_requests": 0}
    return counts


def tool_use_id(call_id: str) -> str:
    """Anthropic-style id for a call; ids that come back in tool_result pass through unchanged."""
    return call_id if call_id.startswith("toolu_") else "toolu_" + call_id.removeprefix("call_")


def server_tool_use_id(call_id: str) -> str:
    """Anthropic-style id for a call the server runs."""
    return "srvtoolu_" + call_id.removeprefix("call_")


def search_content(result: ServerToolResult) -> list[dict[str, Any]] | dict[str, Any]:
    """A web_search_tool_result's content: the pages found, or the error."""
    if result.error is not None:
        return {"type": "web_search_tool_result_error", "error_code": _SEARCH_ERRORS[result.error]}
    return [
        {
            "type": "web_search_result",
            "url": source.url,
            "title": source.title,
            # Anthropic's is its own sealed copy of the page, for citations; Kronk has none.
            "encrypted_content": "",
            "page_age": source.page_age,
        }
        for source in result.sources
    ]


def signature(thinking: str) -> str:
    """The thinking block's `signature`: clients require one. A digest of the text, not a proof;
    Kronk ignores signatures it is sent back."""
    return hashlib.sha256(thinking.encode()).hexdigest()


def message_dict(
    message_id: str,
    model: str,
    content: list[dict[str, Any]],
    last: ChatDelta | None,
    usage: dict[str, Any],
) -> dict[str, Any]:
    """A Message object; `last` is the final delta, None for the message_start skeleton."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": None if last is None else stop_reason(last),
        "stop_sequence": None if last is None else last.stop_sequence,
        "usage": usage,
    }


@dataclass
class ContentBlocks:
    """Groups deltas into content blocks, in the order the model produced them.

    `feed` returns the content_block_* events a stream sends; `content` is the
    finished blocks, so a streamed and a non-streamed answer agree block for block.
    """

    content: list[dict[str, Any]] = field(default_factory=list)
    # The web searches Kronk sent (a call refused for max_uses or its input is not one).
    web_searches: int = 0
    _open: Literal["text", "thinking"] | None = None
    # The block index of each call still streaming, by call id.
    _tool_uses: dict[str, int] = field(default_factory=dict)

    def feed(self, delta: ToolLoopEvent) -> list[Event]:
        if isinstance(delta, ServerToolUse):
            return self._server_tool(delta)
        events: list[Event] = []
        if delta.reasoning:
            events += self._append("thinking", delta.reasoning)
        if delta.content:
            events += self._append("text", delta.content)
        for piece in delta.tool_call_deltas:
            events += self._tool_use_piece(piece)
        for call in delta.tool_calls:
            # The call is whole: its input is the JSON its pieces streamed.
            index = self._tool_uses.pop(call.id)
            self.content[index]["input"] = json.loads(call.arguments)
            events.append(_event("content_block_stop", index=index))
        return events

    def _server_tool(self, use: ServerToolUse) -> list[Event]:
        """A search Kronk runs: its server_tool_use block (the input streamed as one
        fragment), then its web_search_tool_result block, each whole."""
        block_id = server_tool_use_id(use.call.id)
        if use.result is None:
            events = self.close()
            start = {"type": "server_tool_use", "id": block_id, "name": use.call.name, "input": {}}
            self.content.append({**start, "input": dict(use.arguments)})
            index = len(self.content) - 1
            delta = {"type": "input_json_delta", "partial_json": json.dumps(use.arguments)}
            return [
                *events,
                _event("content_block_start", index=index, content_block=start),
                _event("content_block_delta", index=index, delta=delta),
                _event("content_block_stop", index=index),
            ]
        if use.result.error not in ("max_uses_exceeded", "invalid_input"):
            self.web_searches += 1
        block = {
            "type": "web_search_tool_result",
            "tool_use_id": block_id,
            "content": search_content(use.result),
        }
        self.content.append(block)
        index = len(self.content) - 1
        return [
            _event("content_block_start", index=index, content_block=block),
            _event("content_block_stop", index=index),
        ]

    def _tool_use_piece(self, piece: ToolCallDelta) -> list[Event]:
        """A call's first piece starts its tool_use block (empty input); fragments of its
        arguments are input_json_delta events."""
        events: list[Event] = []
        if piece.name is not None:
            events += self.close()
            block: dict[str, Any] = {"type": "tool_use", "id": tool_use_id(piece.id)}
            block.update(name=piece.name, input={})
            self.content.append(block)
            self._tool_uses[piece.id] = len(self.content) - 1
            events.append(
                _event("content_block_start", index=len(self.content) - 1, content_block=block)
            )
        if piece.arguments:
            delta = {"type": "input_json_delta", "partial_json": piece.arguments}
            index = self._tool_uses[piece.id]
            events.append(_event("content_block_delta", index=index, delta=delta))
        return events

    def close(self) -> list[Event]:
        """End the open text or thinking block, if any."""
        if self._open is None:
            return []
        index = len(self.content) - 1
        events: list[Event] = []
        block = self.content[index]
        if self._open == "thinking":
            block["signature"] = signature(block["thinking"])
            delta = {"type": "signature_delta", "signature": block["signature"]}
            events.append(_event("content_block_delta", index=index, delta=delta))
        self._open = None
        return [*events, _event("content_block_stop", index=index)]

    def _append(self, kind: Literal["text", "thinking"], text: str) -> list[Event]:
        events: list[Event] = []
        if self._open != kind:
            events += self.close()
            start: dict[str, Any] = {"type": kind, kind: ""}
            if kind == "thinking":
                start["signature"] = ""
            self.content.append(dict(start))
            self._open = kind
            events.append(
                _event("content_block_start", index=len(self.content) - 1, content_block=start)
            )
        index = len(self.content) - 1
        self.content[index][kind] += text
        delta = {"type": f"{kind}_delta", kind: text}
        return [*events, _event("content_block_delta", index=index, delta=delta)]


def _event(name: str, **payload: Any) -> Event:
    return name, {"type": name, **payload}
