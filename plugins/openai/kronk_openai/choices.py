"""A request's n choices as OpenAI answers them: streamed side by side, usage counted once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence

from kronk_core.contract import ChatDelta, ChatStream, Usage


async def merged(streams: Sequence[ChatStream]) -> AsyncIterator[tuple[int, ChatDelta]]:
    """Each choice's deltas, with its index, in the order they come. Closed early (the
    client left) or failing in one choice, it stops them all."""
    iterators = [aiter(stream) for stream in streams]
    pending: dict[asyncio.Future[ChatDelta], int] = {}
    try:
        if len(iterators) == 1:  # no task per delta for the common case
            async for delta in iterators[0]:
                yield 0, delta
            return
        pending = {asyncio.ensure_future(anext(it)): index for index, it in enumerate(iterators)}
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in sorted(done, key=pending.__getitem__):
                index = pending.pop(future)
                try:
                    delta = future.result()
                except StopAsyncIteration:
                    continue
                yield index, delta
                pending[asyncio.ensure_future(anext(iterators[index]))] = index
    finally:
        for future in pending:
            future.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for iterator in iterators:
            if isinstance(iterator, AsyncGenerator):
                await iterator.aclose()  # its generation stops and reports now


def total_usage(usages: Mapping[int, Usage]) -> Usage:
    """The request's usage from its choices' (by index), as OpenAI counts it: the prompt
    once (the first choice's, whose prefill the others copy), every choice's completion."""
    first = usages[min(usages)]
    every: Sequence[Usage] = list(usages.values())
    return Usage(
        prompt_tokens=first.prompt_tokens,
        completion_tokens=sum(usage.completion_tokens for usage in every),
        cached_tokens=first.cached_tokens,
        reasoning_tokens=sum(usage.reasoning_tokens for usage in every),
        dropped_tokens=first.dropped_tokens,
        accepted_prediction_tokens=sum(usage.accepted_prediction_tokens for usage in every),
        rejected_prediction_tokens=sum(usage.rejected_prediction_tokens for usage in every),
    )
