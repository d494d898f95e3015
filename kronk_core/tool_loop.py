"""Generate, run the server tools the model called, continue: one request, any dialect.

`start_tool_loop` offers the model the server tools (kronk_core.contract.server_tools)
next to the request's own. When a generation calls one, the loop runs it, appends the
assistant turn with its calls and a tool turn per result to the conversation, and starts the
next generation on that; the cache strategy finds the earlier prompt in the slot, so a
continuation prefills only the new turns. It yields the client's chat deltas (the server
tools' calls taken out) and a `ServerToolUse` before and after each call, which each dialect
reports in its own shape.

The calls one request makes are bounded by each tool's `max_uses`: a call past it is not
run, its result says so (`max_uses_exceeded`), and the model answers with what it has; a
model that calls again after two such rounds in a row gets no further generation.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

from kronk_core.contract.server_tools import ServerTool, ServerToolResult, tool_spec
from kronk_core.contract.types import (
    ChatDelta,
    ChatMessage,
    ChatRequest,
    FinishReason,
    ToolCall,
    ToolChoice,
    Usage,
)
from kronk_core.runtime.chat_stream import ChatStream

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServerToolUse:
    """A server tool's call: about to run (`result` None), then run.

    `arguments` are the call's arguments as the model wrote them, parsed ({} when they are
    not a JSON object).
    """

    call: ToolCall
    arguments: Mapping[str, Any]
    result: ServerToolResult | None = None


ToolLoopEvent = ChatDelta | ServerToolUse


@dataclass(slots=True)
class _Generation:
    """What one generation wrote, as far as the loop needs it."""

    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    server_calls: list[ToolCall] = field(default_factory=list)
    client_calls: int = 0
    # Ids of the server tools' calls still streaming: their pieces are the loop's.
    server_ids: set[str] = field(default_factory=set)
    last: ChatDelta | None = None


class ToolLoop:
    """A started chat that runs server tools: iterate it for `ToolLoopEvent`s; the last is
    the final ChatDelta (finish reason and the usage of every generation, summed).

    `model_id` and `prompt_tokens` are the first generation's; `turns` the assistant and tool
    messages the loop added to the conversation, and `uses` the calls each tool ran, so far.
    """

    def __init__(
        self,
        first: ChatStream,
        request: ChatRequest,
        tools: Mapping[str, ServerTool],
        limits: Mapping[str, int],
        start: Callable[[ChatRequest], Awaitable[ChatStream]],
    ) -> None:
        self._stream = first
        self._request = request
        self._tools = tools
        self._limits = limits
        self._start = start
        self.model_id = first.model_id
        self.prompt_tokens = first.prompt_tokens
        self.turns: tuple[ChatMessage, ...] = ()
        self.uses: dict[str, int] = dict.fromkeys(tools, 0)

    def __aiter__(self) -> AsyncIterator[ToolLoopEvent]:
        return self._iterate()

    def cancel(self) -> None:
        self._stream.cancel()

    async def _iterate(self) -> AsyncGenerator[ToolLoopEvent, None]:
        try:
            total = Usage()
            refused_before = False
            while True:
                generation = _Generation()
                async with aclosing(self._generate(generation)) as deltas:
                    async for delta in deltas:
                        yield delta
                last = generation.last
                assert last is not None and last.usage is not None
                _add(total, last.usage)
                calls = generation.server_calls
                if not calls or last.finish_reason is FinishReason.length:
                    yield _final(last, total, generation.client_calls)
                    return
                results: list[ChatMessage] = []
                refused = True
                for call in calls:
                    arguments = _arguments(call)
                    yield ServerToolUse(call, arguments)
                    result = await self._run(call, arguments)
                    refused = refused and result.error == "max_uses_exceeded"
                    yield ServerToolUse(call, arguments, result)
                    results.append(
                        ChatMessage(role="tool", content=result.text, tool_call_id=call.id)
                    )
                if generation.client_calls or (refused and refused_before):
                    yield _final(last, total, generation.client_calls)
                    return
                refused_before = refused
                assistant = ChatMessage(
                    role="assistant",
                    content="".join(generation.content) or None,
                    tool_calls=tuple(calls),
                    reasoning_content="".join(generation.reasoning) or None,
                )
                self.turns = (*self.turns, assistant, *results)
                self._stream = await self._start(_continued(self._request, self.turns, total))
        finally:
            # Left early (the client went away): the generation running now stops.
            self._stream.cancel()

    async def _generate(self, generation: _Generation) -> AsyncGenerator[ChatDelta, None]:
        """The current generation's deltas, without the server tools' calls (kept in
        `generation`); its final delta is kept, not yielded."""
        deltas = aiter(self._stream)
        try:
            async for delta in deltas:
                if delta.finish_reason is not None:
                    generation.last = delta
                    continue
                generation.content.append(delta.content)
                generation.reasoning.append(delta.reasoning)
                kept = self._client_part(delta, generation)
                if kept is not None:
                    yield kept
        finally:
            self._stream.cancel()
            if isinstance(deltas, AsyncGenerator):
                await deltas.aclose()

    def _client_part(self, delta: ChatDelta, generation: _Generation) -> ChatDelta | None:
        """`delta` without the pieces and calls of server tools (None: nothing left)."""
        if not delta.tool_call_deltas and not delta.tool_calls:
            return delta
        pieces = []
        for piece in delta.tool_call_deltas:
            if piece.name is not None and piece.name in self._tools:
                generation.server_ids.add(piece.id)
            if piece.id not in generation.server_ids:
                pieces.append(piece)
        calls = []
        for call in delta.tool_calls:
            if call.name in self._tools:
                generation.server_calls.append(call)
            else:
                calls.append(call)
        generation.client_calls += len(calls)
        kept = replace(delta, tool_call_deltas=tuple(pieces), tool_calls=tuple(calls))
        if kept == ChatDelta():
            return None
        return kept

    async def _run(self, call: ToolCall, arguments: Mapping[str, Any]) -> ServerToolResult:
        tool = self._tools[call.name]
        limit = min(tool.max_uses, self._limits.get(call.name, tool.max_uses))
        if self.uses[call.name] >= limit:
            return ServerToolResult(
                f"{call.name} may be called at most {limit} times in this request; "
                "answer with what you have found.",
                error="max_uses_exceeded",
            )
        self.uses[call.name] += 1
        if not isinstance(_parsed(call.arguments), dict):
            return ServerToolResult(
                f"the arguments of {call.name} must be a JSON object", error="invalid_input"
            )
        try:
            return await tool.run(arguments)
        except Exception:
            # A plugin's bug must not end the request: the model answers without the tool.
            log.exception("server tool %s failed", call.name)
            return ServerToolResult(f"{call.name} failed", error="unavailable")


def _parsed(arguments: str) -> Any:
    try:
        return json.loads(arguments or "{}")
    except ValueError:
        return None


def _arguments(call: ToolCall) -> Mapping[str, Any]:
    value = _parsed(call.arguments)
    return value if isinstance(value, dict) else {}


def _continued(request: ChatRequest, turns: tuple[ChatMessage, ...], used: Usage) -> ChatRequest:
    """The next generation's request: the conversation with the loop's turns; a forced call
    was made (the server tool's), so the model now chooses; the tokens left of max_tokens."""
    choice = request.tool_choice
    if choice.mode in ("required", "function"):
        choice = ToolChoice()
    max_tokens = request.max_tokens
    if max_tokens is not None:
        max_tokens = max(1, max_tokens - used.completion_tokens)
    return replace(
        request,
        messages=(*request.messages, *turns),
        tool_choice=choice,
        max_tokens=max_tokens,
        continue_final_message=False,
    )


def _add(total: Usage, usage: Usage) -> None:
    total.prompt_tokens += usage.prompt_tokens
    total.completion_tokens += usage.completion_tokens
    total.cached_tokens += usage.cached_tokens
    total.reasoning_tokens += usage.reasoning_tokens
    total.dropped_tokens += usage.dropped_tokens
    total.accepted_prediction_tokens += usage.accepted_prediction_tokens
    total.rejected_prediction_tokens += usage.rejected_prediction_tokens


def _final(last: ChatDelta, total: Usage, client_calls: int) -> ChatDelta:
    """The last delta of the whole loop: tool_calls only when the client has calls to run."""
    reason = last.finish_reason
    if reason is FinishReason.tool_calls and not client_calls:
        reason = FinishReason.stop
    return replace(last, finish_reason=reason, usage=total)


class ChatStarter(Protocol):
    """What starts a chat: the SDK facade (`Kronk`)."""

    async def start_chat(
        self, request: ChatRequest, *, wait: float | None = None, subject: str | None = None
    ) -> ChatStream: ...


async def start_tool_loop(
    kronk: ChatStarter,
    request: ChatRequest,
    tools: Sequence[ServerTool],
    *,
    max_uses: Mapping[str, int] | None = None,
    wait: float | None = None,
    subject: str | None = None,
) -> ToolLoop:
    """`kronk.start_chat(request)`, with `tools` offered besides the request's own: Kronk runs
    each call and continues the answer with its result, inside this request. `max_uses`
    lowers a tool's `max_uses` for this request, by tool name. Errors before the first token
    raise here, as from `start_chat`; `wait` and `subject` are start_chat's, for every
    generation."""
    by_name = {tool.name: tool for tool in tools}
    offered = replace(request, tools=(*request.tools, *(tool_spec(t) for t in tools)))
    start = partial(kronk.start_chat, wait=wait, subject=subject)
    return ToolLoop(await start(offered), offered, by_name, max_uses or {}, start)
