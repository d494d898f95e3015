"""POST /infill, llama-server's fill in the middle, as editor plugins call it (llama.vscode,
llama.vim): the code around the cursor in, the code between out, in llama-server's
/completion answer shape (`content`, `stop`, `timings`); streamed as its `data:` lines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, post
from litestar.response import Stream

from kronk_api.contract import ENDPOINT_OPT, receive, sse_frame
from kronk_core.contract import (
    ChatDelta,
    ChatResult,
    ChatStream,
    FinishReason,
    Usage,
    collect_choices,
)
from kronk_openai.errors import OPENAI
from kronk_openai.schemas import InfillRequest


def _stop_type(finish: FinishReason, stop_sequence: str | None) -> str:
    if finish is FinishReason.length:
        return "limit"
    return "word" if stop_sequence else "eos"


def _last(stream: ChatStream, usage: Usage, stop_type: str, content: str) -> dict[str, Any]:
    return {
        "content": content,
        "stop": True,
        "model": stream.model_id,
        "stop_type": stop_type,
        "tokens_predicted": usage.completion_tokens,
        "tokens_evaluated": usage.prompt_tokens,
        "tokens_cached": usage.cached_tokens,
        "truncated": False,
        "timings": {
            "prompt_n": usage.prompt_tokens - usage.cached_tokens,
            "cache_n": usage.cached_tokens,
            "predicted_n": usage.completion_tokens,
        },
    }


async def _lines(stream: ChatStream, deltas: AsyncIterator[ChatDelta]) -> AsyncIterator[bytes]:
    async for delta in deltas:
        if delta.finish_reason is not None:
            usage = delta.usage or Usage()
            stop_type = _stop_type(delta.finish_reason, delta.stop_sequence)
            yield sse_frame(_last(stream, usage, stop_type, ""))
        elif delta.content:
            yield sse_frame({"content": delta.content, "stop": False})


@post("/infill", status_code=200, opt={ENDPOINT_OPT: "completions"})
async def infill(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
    """llama-server's fill-in-the-middle: the text between a prefix and a suffix, with other files
    of the project as context."""
    received = await receive(request, InfillRequest)
    body = received.body
    (stream,) = await received.kronk.start_choices(body.to_core())
    if body.stream:
        return await OPENAI.open_stream(
            request, aiter(stream), lambda deltas: _lines(stream, deltas)
        )
    results = await OPENAI.respond(request, collect_choices([stream]))
    if isinstance(results, Response):
        return results
    (result,) = results
    assert isinstance(result, ChatResult)
    stop_type = _stop_type(result.finish_reason, result.stop_sequence)
    return Response(_last(stream, result.usage, stop_type, result.content))
