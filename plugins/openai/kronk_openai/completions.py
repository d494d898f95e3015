"""POST /v1/completions: OpenAI's legacy text completions (a raw prompt, no chat template)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from litestar import Request, Response, post
from litestar.response import Stream

from kronk_api.contract import ENDPOINT_OPT, receive, sse_frame
from kronk_core.contract import (
    ChatDelta,
    ChatResult,
    InvalidRequestError,
    TokenLogprob,
    Usage,
    collect_choices,
)
from kronk_openai.answers import FINISH_REASONS, usage_dict
from kronk_openai.choices import merged, total_usage
from kronk_openai.errors import OPENAI
from kronk_openai.schemas import TextCompletionRequest, UsageInStream


@post("/v1/completions", status_code=200, opt={ENDPOINT_OPT: "completions"})
async def completions(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
    """OpenAI legacy completions: a prompt in, its continuation out, streamed with `stream`."""
    received = await receive(request, TextCompletionRequest)
    body = received.body
    try:
        streams = await received.kronk.start_choices(body.to_core())
    except InvalidRequestError as exc:
        if exc.param == "n" and body.candidates > body.n:  # the slots bound best_of
            raise InvalidRequestError(
                "best_of" + exc.message.removeprefix("n"), param="best_of"
            ) from None
        raise
    stream = streams[0]
    echoed = body.prompt_input() if body.echo else ""
    assert isinstance(echoed, str)  # the schema echoes text prompts only
    base = {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(stream.created),
        "model": stream.model_id,
    }
    if body.stream:
        return await OPENAI.open_stream(
            request,
            merged(streams),
            lambda deltas: _sse(
                base,
                len(streams),
                deltas,
                echoed,
                body.logprobs,
                body.usage_in_stream,
                stream.prompt_text if body.return_prompt else None,
            ),
        )
    results = await OPENAI.respond(request, collect_choices(streams))
    if isinstance(results, Response):
        return results
    usage = total_usage(dict(enumerate(result.usage for result in results)))
    choices = [
        {
            "text": echoed + result.content,
            "index": index,
            "logprobs": None if body.logprobs is None else legacy_logprobs(result.logprobs, 0),
            "finish_reason": FINISH_REASONS[result.finish_reason],
        }
        for index, result in enumerate(best(results, body.n))
    ]
    answer = {**base, "choices": choices, "usage": usage_dict(usage)}
    if body.return_prompt:
        answer["prompt"] = stream.prompt_text
    return Response(answer)


def best(results: Sequence[ChatResult], n: int) -> list[ChatResult]:
    """OpenAI's best_of: of the candidates, the n with the highest log-probability per token,
    best first (all of them, in order, when there are only n)."""
    if len(results) <= n:
        return list(results)

    def per_token(result: ChatResult) -> float:
        return sum(entry.logprob for entry in result.logprobs) / max(1, len(result.logprobs))

    return sorted(results, key=per_token, reverse=True)[:n]


async def _sse(
    base: dict[str, Any],
    n: int,
    deltas: AsyncIterator[tuple[int, ChatDelta]],
    echoed: str,
    logprobs: int | None,
    usage_in: UsageInStream,
    prompt: str | None,
) -> AsyncIterator[bytes]:
    def chunk(
        index: int, text: str, entries: Sequence[TokenLogprob], finish: str | None, **extra: Any
    ) -> bytes:
        choice: dict[str, Any] = {
            "text": text,
            "index": index,
            "logprobs": None if logprobs is None else legacy_logprobs(entries, offsets[index]),
            "finish_reason": finish,
        }
        payload: dict[str, Any] = {**base, "choices": [choice]}
        if usage_in is UsageInStream.own_chunk:
            payload["usage"] = None
        return sse_frame(payload | extra)

    offsets = [0] * n
    if echoed:
        for index in range(n):
            yield chunk(index, echoed, (), None)
            offsets[index] = len(echoed)
    usages: dict[int, Usage] = {}
    running = n
    async for index, delta in deltas:
        if delta.finish_reason is not None:
            running -= 1
            if delta.usage is not None:
                usages[index] = delta.usage
            finish = FINISH_REASONS[delta.finish_reason]
            if running:
                yield chunk(index, "", (), finish)
                continue
            # The last choice to finish carries what belongs to the whole request.
            usage = usage_dict(total_usage(usages)) if usages else None
            extra: dict[str, Any] = {} if prompt is None else {"prompt": prompt}
            if usage_in is UsageInStream.finish_chunk:
                extra["usage"] = usage
            yield chunk(index, "", (), finish, **extra)
            if usage_in is UsageInStream.own_chunk and usage is not None:
                yield sse_frame({**base, "choices": [], "usage": usage})
            continue
        if delta.content or delta.logprobs:
            yield chunk(index, delta.content, delta.logprobs, None)
            offsets[index] += len(delta.content)
    # Not after an error: the dialect's stream tail ends the stream with its error frame.
    yield b"data: [DONE]\n\n"


def legacy_logprobs(entries: Sequence[TokenLogprob], offset: int) -> dict[str, Any]:
    """The completions API's log-probabilities: parallel lists, `text_offset` counting the
    characters before each token in the returned text (from `offset`)."""
    offsets = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry.token)
    return {
        "tokens": [entry.token for entry in entries],
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [
            {top.token: top.logprob for top in entry.top_logprobs} for entry in entries
        ],
        "text_offset": offsets,
    }
