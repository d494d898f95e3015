"""The streamed answer: Anthropic's named server-sent events (pings come from the dialect)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from kronk_anthropic.answers import ContentBlocks, Event, message_dict, stop_reason, usage_dict
from kronk_anthropic.errors import ANTHROPIC
from kronk_api.contract import sse_frame
from kronk_core.contract import ChatDelta, ToolLoopEvent, Usage


def encode(event: Event) -> bytes:
    name, payload = event
    return sse_frame(payload, name)


async def sse(
    message_id: str,
    model: str,
    prompt_tokens: int,
    deltas: AsyncIterator[ToolLoopEvent],
    web_search: bool = False,
) -> AsyncIterator[bytes]:
    """message_start, ping, the content blocks, message_delta, message_stop (an error past
    the start is the dialect's stream tail: `Dialect.with_stream_errors`).

    The cache split of the prompt is known only at the end: message_start
    counts the whole prompt as input, message_delta carries the final counts (with
    `web_search` served, the searches run too).
    """
    start_usage = usage_dict(Usage(prompt_tokens=prompt_tokens))
    skeleton = message_dict(message_id, model, [], None, start_usage)
    yield encode(("message_start", {"type": "message_start", "message": skeleton}))
    yield ANTHROPIC.keepalive_frame
    blocks = ContentBlocks()
    async for delta in deltas:
        for event in blocks.feed(delta):
            yield encode(event)
        if not isinstance(delta, ChatDelta) or delta.finish_reason is None:
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
                    "usage": usage_dict(delta.usage, blocks.web_searches if web_search else None),
                },
            )
        )
        yield encode(("message_stop", {"type": "message_stop"}))
