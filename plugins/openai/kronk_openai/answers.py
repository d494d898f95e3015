"""Core results → OpenAI response objects (plain dicts ready for JSON)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kronk_core.contract import ChatDelta, FinishReason, TokenLogprob, ToolCall, Usage

FINISH_REASONS = {
    FinishReason.stop: "stop",
    FinishReason.length: "length",
    FinishReason.tool_calls: "tool_calls",
    FinishReason.cancelled: "stop",
    FinishReason.error: "stop",
}


def usage_dict(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "dropped_tokens": usage.dropped_tokens,
        },
        "completion_tokens_details": {
            "reasoning_tokens": usage.reasoning_tokens,
            # Speculative decoding's draft tokens, in the fields OpenAI uses for predictions.
            "accepted_prediction_tokens": usage.accepted_prediction_tokens,
            "rejected_prediction_tokens": usage.rejected_prediction_tokens,
        },
    }


def logprobs_dict(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": entry.token,
                "logprob": entry.logprob,
                "bytes": list(entry.bytes),
                "top_logprobs": [
                    {"token": top.token, "logprob": top.logprob, "bytes": list(top.bytes)}
                    for top in entry.top_logprobs
                ],
            }
            for entry in entries
        ]
    }


def tool_call_dict(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def delta_dicts(delta: ChatDelta, call_indexes: dict[str, int]) -> list[dict[str, Any]]:
    """The chunk deltas for one core delta: text first, then the tool-call pieces as
    OpenAI streams them: a call's first carries its index, id, type and name, later ones
    its index and the next fragment of its arguments. `call_indexes` numbers the calls
    of the answer by id (it grows as calls start)."""
    out: dict[str, Any] = {}
    if delta.content:
        out["content"] = delta.content
    if delta.reasoning:
        out["reasoning_content"] = delta.reasoning
    chunks = [out] if out else []
    for piece in delta.tool_call_deltas:
        index = call_indexes.setdefault(piece.id, len(call_indexes))
        entry: dict[str, Any] = {"index": index, "function": {"arguments": piece.arguments}}
        if piece.name is not None:
            entry.update(id=piece.id, type="function")
            entry["function"] = {"name": piece.name, "arguments": piece.arguments}
        chunks.append({"tool_calls": [entry]})
    return chunks
