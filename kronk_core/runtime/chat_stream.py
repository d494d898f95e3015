"""Engine events to chat deltas: a started generation, parsed as it streams."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace

from kronk_core.contract.errors import KronkError
from kronk_core.contract.generation import Finished
from kronk_core.contract.records import ChatRecord, RequestRecord
from kronk_core.contract.templates import OutputParser
from kronk_core.contract.types import (
    ChatDelta,
    ChatResult,
    FinishReason,
    TokenLogprob,
    ToolCall,
    Usage,
)
from kronk_core.runtime.engine import GenerationStream


@dataclass(frozen=True, slots=True)
class ChatTimes:
    """When `start_chat` began, leased its model and had its prompt ready (monotonic)."""

    request_id: str
    started_at: float
    prompt_started_at: float
    prompt_ready_at: float
    tools: int = 0


class ChatStream:
    """A started chat generation: prompt already checked and queued; iterate for deltas.

    When the stream ends (finished, failed or left early), `on_finished`
    receives its ChatRecord.
    """

    def __init__(
        self,
        model_id: str,
        stream: GenerationStream,
        parser: OutputParser,
        prompt_tokens: int,
        dropped_tokens: int = 0,
        parallel_tool_calls: bool = True,
        times: ChatTimes | None = None,
        on_finished: Callable[[ChatRecord], None] | None = None,
        prompt_text: str = "",
    ) -> None:
        self._stream = stream
        self._dropped_tokens = dropped_tokens
        self._parser = parser
        self._parallel_tool_calls = parallel_tool_calls
        self._times = times
        self._on_finished = on_finished
        self._parse_seconds = 0.0
        self._first_call: str | None = None  # the one call kept without parallel_tool_calls
        self.prompt_tokens = prompt_tokens
        # The prompt as rendered for the model (a chat's template output): `return_prompt`.
        self.prompt_text = prompt_text
        self.model_id = model_id
        self.created = time.time()
        # The engine's record of the generation, once the stream has ended (None before,
        # or when it never reached a slot): the timings Ollama's answers report.
        self.record: RequestRecord | None = None

    @property
    def times(self) -> ChatTimes | None:
        return self._times

    def __aiter__(self) -> AsyncIterator[ChatDelta]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ChatDelta]:
        outcome = _Outcome(Usage(prompt_tokens=self.prompt_tokens))
        try:
            async for delta in self._deltas(outcome):
                yield delta
        finally:
            # Closed before the end: the generation stops (a no-op once it finished).
            self._stream.cancel()
            self._report(outcome)

    def _report(self, outcome: _Outcome) -> None:
        if self._on_finished is None or self._times is None:
            return
        times = self._times
        self._on_finished(
            ChatRecord(
                request_id=times.request_id,
                model=self.model_id,
                started_at=times.started_at,
                prompt_started_at=times.prompt_started_at,
                prompt_ready_at=times.prompt_ready_at,
                finished_at=time.monotonic(),
                finish_reason=outcome.reason.value,
                usage=outcome.usage,
                tools=times.tools,
                tool_calls=outcome.tool_calls,
                parse_seconds=self._parse_seconds,
                generation=outcome.record,
            )
        )

    def _parse(self, text: str) -> list[ChatDelta]:
        began = time.perf_counter()
        try:
            return self._parser.feed(text) if text else []
        finally:
            self._parse_seconds += time.perf_counter() - began

    def _finish_parse(self, truncated: bool) -> list[ChatDelta]:
        began = time.perf_counter()
        try:
            return self._parser.finish(truncated=truncated)
        finally:
            self._parse_seconds += time.perf_counter() - began

    async def _deltas(self, outcome: _Outcome) -> AsyncIterator[ChatDelta]:
        calls = 0
        counter = _ReasoningCounter()
        async for event in self._stream:
            if isinstance(event, Finished):
                outcome.record = self.record = event.record
                break
            outcome.usage.completion_tokens += event.token_count
            parts = self._parse(event.text)
            counter.add(event.token_count, parts)
            if event.logprobs:
                head = parts[0] if parts else ChatDelta()
                parts = [_with_logprobs(head, event.logprobs), *parts[1:]]
            for part in parts:
                part, calls = self._limit_calls(part, calls)
                outcome.tool_calls = calls
                yield part
        else:
            raise KronkError("generation ended without a finish event")
        outcome.usage, outcome.reason = event.usage, event.reason
        if event.reason is FinishReason.error:
            raise event.error or KronkError("generation failed")
        parts = self._finish_parse(event.reason is FinishReason.length)
        counter.add(0, parts)
        counter.close()
        for part in parts:
            part, calls = self._limit_calls(part, calls)
            yield part
        event.usage.dropped_tokens = self._dropped_tokens
        event.usage.reasoning_tokens = counter.reasoning_tokens
        reason = event.reason
        if calls and reason is FinishReason.stop:
            reason = FinishReason.tool_calls
        outcome.reason, outcome.tool_calls = reason, calls
        yield ChatDelta(finish_reason=reason, usage=event.usage, stop_sequence=event.stop_sequence)

    def _limit_calls(self, part: ChatDelta, calls: int) -> tuple[ChatDelta, int]:
        """parallel_tool_calls false: only the first call goes out, its pieces included."""
        if self._parallel_tool_calls or not (part.tool_calls or part.tool_call_deltas):
            return part, calls + len(part.tool_calls)
        first = self._first_call
        if first is None and part.tool_call_deltas:
            first = self._first_call = part.tool_call_deltas[0].id
        pieces = tuple(piece for piece in part.tool_call_deltas if piece.id == first)
        keep = tuple(call for call in part.tool_calls if call.id == first)[: max(0, 1 - calls)]
        return replace(part, tool_calls=keep, tool_call_deltas=pieces), calls + len(keep)

    def cancel(self) -> None:
        self._stream.cancel()


@dataclass(slots=True)
class _Outcome:
    """How a chat stream ended, as far as it got: what its ChatRecord reports."""

    usage: Usage
    reason: FinishReason = FinishReason.cancelled
    tool_calls: int = 0
    record: RequestRecord | None = None


class _ReasoningCounter:
    """Counts generated tokens whose text came out as reasoning.

    Tokens whose text the parser still holds back count as whatever it
    becomes once released; text it never releases (trailing whitespace) as
    what came before.
    """

    def __init__(self) -> None:
        self.reasoning_tokens = 0
        self._undecided = 0
        self._in_reasoning = False

    def add(self, tokens: int, parts: Sequence[ChatDelta]) -> None:
        self._undecided += tokens
        if not parts:
            return
        self._in_reasoning = any(part.reasoning for part in parts) and not any(
            part.content or part.tool_calls or part.tool_call_deltas for part in parts
        )
        self.close()

    def close(self) -> None:
        if self._in_reasoning:
            self.reasoning_tokens += self._undecided
        self._undecided = 0


def _with_logprobs(delta: ChatDelta, logprobs: tuple[TokenLogprob, ...]) -> ChatDelta:
    return ChatDelta(
        content=delta.content,
        reasoning=delta.reasoning,
        tool_calls=delta.tool_calls,
        tool_call_deltas=delta.tool_call_deltas,
        logprobs=delta.logprobs + logprobs,
        finish_reason=delta.finish_reason,
        usage=delta.usage,
    )


async def collect(stream: ChatStream) -> ChatResult:
    """Drain a ChatStream into a ChatResult."""
    content: list[str] = []
    reasoning: list[str] = []
    tool_calls: list[ToolCall] = []
    logprobs: list[TokenLogprob] = []
    finish = FinishReason.stop
    usage = Usage()
    stop_sequence = None
    async for delta in stream:
        content.append(delta.content)
        reasoning.append(delta.reasoning)
        tool_calls.extend(delta.tool_calls)
        logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            finish = delta.finish_reason
        if delta.usage is not None:
            usage = delta.usage
            stop_sequence = delta.stop_sequence
    return ChatResult(
        content="".join(content),
        reasoning="".join(reasoning),
        finish_reason=finish,
        usage=usage,
        tool_calls=tool_calls,
        logprobs=logprobs,
        stop_sequence=stop_sequence,
    )


async def collect_choices(streams: Sequence[ChatStream]) -> list[ChatResult]:
    """Drain a request's choices side by side, in choice order; if one fails (or this is
    cancelled), the others stop too."""
    tasks = [asyncio.ensure_future(collect(stream)) for stream in streams]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        for stream in streams:
            stream.cancel()
