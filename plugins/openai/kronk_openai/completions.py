"""POST /v1/completions: OpenAI's legacy text completions (a raw prompt, no chat template)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from litestar import Request, Response, post
from litestar.response import Stream

from kronk_api.dialect import sse_frame
from kronk_api.endpoints import ENDPOINT_OPT
from kronk_api.http import kronk_of, parse_body
from kronk_core.errors import KronkError
from kronk_core.sdk import collect
from kronk_core.types import ChatDelta, TokenLogprob
from kronk_openai.errors import OPENAI
from kronk_openai.objects import FINISH_REASONS, usage_dict
from kronk_openai.schemas import TextCompletionRequest, UsageInStream


@post("/v1/completions", status_code=200, opt={ENDPOINT_OPT: "completions"})
async def completions(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
    body: TextCompletionRequest = await parse_body(request, TextCompletionRequest)
    stream = await kronk_of(request).start_completion(body.to_core())
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
            aiter(stream),
            lambda deltas: _sse(
                base,
                deltas,
                echoed,
                body.logprobs,
                body.usage_in_stream,
                stream.prompt_text if body.return_prompt else None,
            ),
        )
    result = await OPENAI.respond(request, collect(stream))
    if isinstance(result, Response):
        return result
    choice = {
        "text": echoed + result.content,
        "index": 0,
        "logprobs": None if body.logprobs is None else legacy_logprobs(result.logprobs, 0),
        "finish_reason": FINISH_REASONS[result.finish_reason],
    }
    answer = {**base, "choices": [choice], "usage": usage_dict(result.usage)}
    if body.return_prompt:
        answer["prompt"] = stream.prompt_text
    return Response(answer)


async def _sse(
    base: dict[str, Any],
    deltas: AsyncIterator[ChatDelta],
    echoed: str,
    logprobs: int | None,
    usage_in: UsageInStream,
    prompt: str | None,
) -> AsyncIterator[bytes]:
    def chunk(
        text: str, entries: Sequence[TokenLogprob], finish: str | None, **extra: Any
    ) -> bytes:
        choice: dict[str, Any] = {
            "text": text,
            "index": 0,
            "logprobs": None if logprobs is None else legacy_logprobs(entries, offset),
            "finish_reason": finish,
        }
        payload: dict[str, Any] = {**base, "choices": [choice]}
        if usage_in is UsageInStream.own_chunk:
            payload["usage"] = None
        return sse_frame(payload | extra)

    offset = 0
    if echoed:
        yield chunk(echoed, (), None)
        offset = len(echoed)
    try:
        async for delta in deltas:
            if delta.finish_reason is not None:
                usage = None if delta.usage is None else usage_dict(delta.usage)
                extra: dict[str, Any] = {} if prompt is None else {"prompt": prompt}
                if usage_in is UsageInStream.finish_chunk:
                    extra["usage"] = usage
                yield chunk("", (), FINISH_REASONS[delta.finish_reason], **extra)
                if usage_in is UsageInStream.own_chunk and usage is not None:
                    yield sse_frame({**base, "choices": [], "usage": usage})
                continue
            if delta.content or delta.logprobs:
                yield chunk(delta.content, delta.logprobs, None)
                offset += len(delta.content)
    except KronkError as exc:
        yield OPENAI.stream_error(exc)
        return
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
