"""Core results → OpenAI response objects (plain dicts ready for JSON)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kronk_core.types import ChatDelta, FinishReason, TokenLogprob, Usage

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
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
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


def delta_dict(delta: ChatDelta) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if delta.content:
        out["content"] = delta.content
    if delta.reasoning:
        out["reasoning_content"] = delta.reasoning
    return out
