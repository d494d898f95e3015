"""The streamed answer: Anthropic's named server-sent events, with ping keep-alives."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator

from kronk_anthropic.errors import sse_error
from kronk_anthropic.responses import ContentBlocks, Event, message_dict, stop_reason, usage_dict
from kronk_api.http import chain
from kronk_core.errors import KronkError
from kronk_core.types import ChatDelta, Usage

# Silence longer than this (a long prefill, a slow model) gets a ping, so proxies and
# clients with read timeouts keep the connection open.
PING_SECONDS = 10.0


async def keepalive(
    deltas: AsyncIterator[ChatDelta], interval: float
) -> AsyncGenerator[ChatDelta | None, None]:
    """The deltas, with a None whenever `interval` seconds pass without one.

    Leaving early cancels the pending read, and with it the generation.
    """
    pending = asyncio.ensure_future(anext(deltas))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield None
                continue
            try:
                delta = pending.result()
            except StopAsyncIteration:
                return
            yield delta
            pending = asyncio.ensure_future(anext(deltas))
    finally:
        pending.cancel()


def encode(event: Event) -> bytes:
    name, payload = event
    return f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()


_PING: Event = ("ping", {"type": "ping"})


async def sse(
    message_id: str,
    model: str,
    prompt_tokens: int,
    first: ChatDelta | None,
    rest: AsyncIterator[ChatDelta | None],
) -> AsyncIterator[bytes]:
    """message_start, ping, the content blocks, message_delta, message_stop.

    `first` is the item already read from `rest` (see keepalive). The cache
    split of the prompt is known only at the end: message_start counts the
    whole prompt as input, message_delta carries the final counts.
    """
    start_usage = usage_dict(Usage(prompt_tokens=prompt_tokens))
    skeleton = message_dict(message_id, model, [], None, start_usage)
    yield encode(("message_start", {"type": "message_start", "message": skeleton}))
    yield encode(_PING)
    blocks = ContentBlocks()
    try:
        async for delta in chain(first, rest):
            if delta is None:
                yield encode(_PING)
                continue
            for event in blocks.feed(delta):
                yield encode(event)
            if delta.finish_reason is None:
                continue
            for event in blocks.close():
                yield encode(event)
            assert delta.usage is not None
            yield encode(
                (
                    "message_delta",
                    {
                        "type": "message_delta",
                        "delta": {
                            "stop_reason": stop_reason(delta),
                            "stop_sequence": delta.stop_sequence,
                        },
                        "usage": usage_dict(delta.usage),
                    },
                )
            )
            yield encode(("message_stop", {"type": "message_stop"}))
    except KronkError as exc:
        yield sse_error(exc)
