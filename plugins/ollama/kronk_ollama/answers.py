"""Chat deltas → Ollama's answer objects: the NDJSON lines of a stream, or one whole object.

/api/chat puts the text in `message` (with `thinking` and `tool_calls`), /api/generate in
`response` (with `thinking`); both end with `done: true` and the request's statistics.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kronk_core.contract import (
    ChatDelta,
    ChatStream,
    FinishReason,
    TokenLogprob,
    ToolCall,
    Usage,
    collect,
)
from kronk_ollama.errors import ndjson_line
from kronk_ollama.models import clock
from kronk_openai.answers import logprobs_dict

# A tool call ends Ollama's answer as any other stop does.
_DONE_REASONS = {FinishReason.length: "length"}


def nanoseconds(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


def tool_call_dict(call: ToolCall, index: int) -> dict[str, Any]:
    return {
        "id": call.id,
        "function": {"index": index, "name": call.name, "arguments": json.loads(call.arguments)},
    }


@dataclass
class Answer:
    """One request's answer; `model` is the name the client sent, which Ollama echoes."""

    model: str
    chat: bool
    # When the request arrived (time.monotonic()), for total_duration.
    started: float
    logprobs: bool = False
    _calls: int = field(default=0, init=False)

    def piece(
        self,
        content: str,
        thinking: str = "",
        calls: Sequence[ToolCall] = (),
        logprobs: Sequence[TokenLogprob] = (),
    ) -> dict[str, Any]:
        """An object with some of the answer, `done` false (the final object sets it)."""
        body: dict[str, Any] = {"model": self.model, "created_at": clock()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = [
                    tool_call_dict(call, index) for index, call in enumerate(calls, self._calls)
                ]
                self._calls += len(calls)
            body["message"] = message
        else:
            body["response"] = content
            if thinking:
                body["thinking"] = thinking
        if self.logprobs and logprobs:
            # The same objects as OpenAI's `logprobs.content`.
            body["logprobs"] = logprobs_dict(logprobs)["content"]
        body["done"] = False
        return body

    def keepalive(self) -> bytes:
        """An empty piece: what a stream sends while a long prefill keeps it silent."""
        return ndjson_line(self.piece(""))

    def done(
        self, body: dict[str, Any], stream: ChatStream, reason: FinishReason, usage: Usage
    ) -> dict[str, Any]:
        """`body` made the final object: done, why, and the counts and timings (ns)."""
        record, times = stream.record, stream.times
        load = times.prompt_started_at - times.started_at if times is not None else 0.0
        prompt_eval = generation = 0.0
        if record is not None and record.started_at:
            prefilled = record.prefilled_at or record.first_token_at or record.finished_at
            prompt_eval = prefilled - record.started_at
            generation = record.finished_at - prefilled
        return {
            **body,
            "done": True,
            "done_reason": _DONE_REASONS.get(reason, "stop"),
            "total_duration": nanoseconds(time.monotonic() - self.started),
            "load_duration": nanoseconds(load),
            "prompt_eval_count": usage.prompt_tokens,
            "prompt_eval_duration": nanoseconds(prompt_eval),
            "eval_count": usage.completion_tokens,
            "eval_duration": nanoseconds(generation),
        }

    async def lines(
        self, stream: ChatStream, deltas: AsyncIterator[ChatDelta]
    ) -> AsyncIterator[bytes]:
        """The streamed answer: a line per delta, then the final line."""
        async for delta in deltas:
            if delta.finish_reason is not None:
                assert delta.usage is not None
                final = self.done(self.piece(""), stream, delta.finish_reason, delta.usage)
                yield ndjson_line(final)
            elif delta.content or delta.reasoning or delta.tool_calls or delta.logprobs:
                yield ndjson_line(
                    self.piece(delta.content, delta.reasoning, delta.tool_calls, delta.logprobs)
                )

    async def whole(self, stream: ChatStream) -> dict[str, Any]:
        """The answer as one object."""
        result = await collect(stream)
        body = self.piece(result.content, result.reasoning, result.tool_calls, result.logprobs)
        return self.done(body, stream, result.finish_reason, result.usage)
