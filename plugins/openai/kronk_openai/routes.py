"""OpenAI routes: chat completions, models, tokenize and detokenize (Kronk's and llama-server's
shapes), and the Responses API's, the legacy completions' and llama-server's infill, mounted
here."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from litestar import Request, Response, Router, get, post
from litestar.params import FromPath
from litestar.response import Stream

from kronk_api.contract import (
    AUTHENTICATED,
    ENDPOINT_OPT,
    kronk_of,
    parse_body,
    receive,
    sse_frame,
    subject_of,
)
from kronk_core.contract import (
    ChatDelta,
    ChatResult,
    ChatStream,
    Kronk,
    MediaKind,
    Usage,
    collect_choices,
)
from kronk_openai.answers import (
    FINISH_REASONS,
    delta_dicts,
    logprobs_dict,
    tool_call_dict,
    usage_dict,
)
from kronk_openai.audio import AUDIO_ROUTES
from kronk_openai.choices import merged, total_usage
from kronk_openai.completions import completions
from kronk_openai.errors import OPENAI
from kronk_openai.infill import infill
from kronk_openai.lora import LORA_ROUTES
from kronk_openai.responses.routes import RESPONSES_ROUTES
from kronk_openai.schemas import (
    ChatCompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    UsageInStream,
)


@post("/v1/chat/completions", status_code=200, opt={ENDPOINT_OPT: "chat-completions"})
async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
    """OpenAI chat completions: messages in, the assistant's message out (tool calls, reasoning,
    log-probs), streamed as chunks with `stream`."""
    received = await receive(request, ChatCompletionRequest)
    body = received.body
    streams = await received.kronk.start_choices(
        body.to_core(received.sources), subject=received.subject
    )
    stream = streams[0]
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    if body.stream:
        return await OPENAI.open_stream(
            request,
            merged(streams),
            lambda deltas: _sse(
                stream,
                len(streams),
                deltas,
                completion_id,
                body.usage_in_stream,
                stream.prompt_text if body.return_prompt else None,
            ),
        )
    results = await OPENAI.respond(request, collect_choices(streams))
    if isinstance(results, Response):
        return results
    with_logprobs = body.logprobs or bool(body.top_logprobs)
    answer = {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(stream.created),
        "model": stream.model_id,
        "choices": [_choice(index, result, with_logprobs) for index, result in enumerate(results)],
        "usage": usage_dict(total_usage(dict(enumerate(result.usage for result in results)))),
    }
    if body.return_prompt:
        answer["prompt"] = stream.prompt_text
    return Response(answer)


def _choice(index: int, result: ChatResult, with_logprobs: bool) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.content}
    if result.reasoning:
        message["reasoning_content"] = result.reasoning
    if result.tool_calls:
        message["content"] = result.content or None
        message["tool_calls"] = [tool_call_dict(call) for call in result.tool_calls]
    return {
        "index": index,
        "message": message,
        "finish_reason": FINISH_REASONS[result.finish_reason],
        "logprobs": logprobs_dict(result.logprobs) if with_logprobs else None,
    }


async def _sse(
    stream: ChatStream,
    n: int,
    deltas: AsyncIterator[tuple[int, ChatDelta]],
    completion_id: str,
    usage_in: UsageInStream,
    prompt: str | None,
) -> AsyncIterator[bytes]:
    base = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": int(stream.created),
        "model": stream.model_id,
    }

    def chunk(choice: dict[str, Any] | None, **extra: Any) -> bytes:
        payload: dict[str, Any] = {**base, "choices": [choice] if choice else []}
        if usage_in is UsageInStream.own_chunk:
            payload["usage"] = None
        return sse_frame(payload | extra)

    for index in range(n):
        role = {"role": "assistant", "content": ""}
        yield chunk({"index": index, "delta": role, "finish_reason": None})
    call_indexes: list[dict[str, int]] = [{} for _ in range(n)]
    usages: dict[int, Usage] = {}
    running = n
    async for index, delta in deltas:
        if delta.finish_reason is not None:
            finish = {
                "index": index,
                "delta": {},
                "finish_reason": FINISH_REASONS[delta.finish_reason],
            }
            running -= 1
            if delta.usage is not None:
                usages[index] = delta.usage
            if running:
                yield chunk(finish)
                continue
            # The last choice to finish carries what belongs to the whole request.
            extra: dict[str, Any] = {} if prompt is None else {"prompt": prompt}
            usage = usage_dict(total_usage(usages)) if usages else None
            if usage_in is UsageInStream.finish_chunk and usage is not None:
                extra["usage"] = usage
            yield chunk(finish, **extra)
            if usage_in is UsageInStream.own_chunk and usage is not None:
                yield chunk(None, usage=usage)
            continue
        for position, piece in enumerate(delta_dicts(delta, call_indexes[index])):
            choice: dict[str, Any] = {"index": index, "delta": piece, "finish_reason": None}
            if delta.logprobs and position == 0:
                choice["logprobs"] = logprobs_dict(delta.logprobs)
            yield chunk(choice)
    # Not after an error: the dialect's stream tail ends the stream with its error frame.
    yield b"data: [DONE]\n\n"


def _model_card(kronk: Kronk, name: str) -> dict[str, Any]:
    """A model (or an alias) as /v1/models lists it: whether it is loaded, the context a
    request gets (loaded, or what a load would choose now; null when not known), and what a
    prompt may hold: text, and the images and sounds its projector reads; `error` says why
    a model cannot be served (a broken file or package), listed rather than failing the list."""
    model_id = kronk.models.canonical(name)
    media = kronk.models.media(model_id)
    card: dict[str, Any] = {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "kronk",
        "loaded": kronk.pool.get(model_id) is not None,
        "context_length": kronk.models.context_length(model_id),
        "input_modalities": ["text", *(kind.value for kind in MediaKind if kind in media)],
    }
    if model_id != name:
        card["alias_of"] = model_id
    error = kronk.models.error(model_id)
    if error is not None:
        card["error"] = error
    return card


def _model_names(kronk: Kronk) -> list[str]:
    """Every model id, then every alias."""
    return [*kronk.models.ids(), *kronk.models.aliases()]


@get("/v1/models", opt={ENDPOINT_OPT: AUTHENTICATED})
async def list_models(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """OpenAI models: the models this server can serve, with Kronk's details (loaded, context,
    media)."""
    kronk = kronk_of(request)

    def cards() -> list[dict[str, Any]]:  # reads GGUF headers and device memory
        return [_model_card(kronk, name) for name in _model_names(kronk)]

    return {"object": "list", "data": await asyncio.to_thread(cards)}


# A path, not a segment: an id or alias may hold a `/` (`org/model`, `openai/gpt-4o`).
@get("/v1/models/{model_id:path}", opt={ENDPOINT_OPT: AUTHENTICATED})
async def get_model(request: Request[Any, Any, Any], model_id: FromPath[Path]) -> dict[str, Any]:
    """One model, by id or alias."""
    kronk = kronk_of(request)
    name = str(model_id).lstrip("/")
    if name not in _model_names(kronk):
        raise kronk.models.unknown(name)
    return await asyncio.to_thread(_model_card, kronk, name)


async def _token_ids(request: Request[Any, Any, Any], body: TokenizeRequest) -> list[int]:
    kronk = kronk_of(request)
    if body.apply_template:
        chat = kronk.chat_request([{"role": "user", "content": body.text}], model=body.model)
        return await kronk.prompt_tokens(
            chat, add_generation_prompt=body.add_generation_prompt, subject=subject_of(request)
        )
    return await kronk.tokenize(
        body.text, model=body.model, add_special=body.add_special, parse_special=body.parse_special
    )


async def _pieces(
    request: Request[Any, Any, Any], ids: list[int], model: str | None
) -> list[dict[str, Any]]:
    """llama-server's pieces: each token's text, or its bytes where they are not valid UTF-8
    (a character the tokenizer split over several tokens)."""
    pieces = await kronk_of(request).token_pieces(ids, model=model)
    return [{"id": token, "piece": _piece(piece)} for token, piece in zip(ids, pieces, strict=True)]


def _piece(piece: bytes) -> str | list[int]:
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


@post("/v1/tokenize", status_code=200, opt={ENDPOINT_OPT: "tokenize"})
async def tokenize(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Kronk's: `tokens` is the count (as it always was), `ids` the token ids."""
    body: TokenizeRequest = await parse_body(request, TokenizeRequest)
    ids = await _token_ids(request, body)
    answer: dict[str, Any] = {
        "object": "tokenize",
        "created": int(time.time()),
        "model": body.model or kronk_of(request).models.default,
        "tokens": len(ids),
        "ids": ids,
    }
    if body.with_pieces:
        answer["pieces"] = await _pieces(request, ids, body.model)
    return answer


@post("/tokenize", status_code=200, opt={ENDPOINT_OPT: "tokenize"})
async def tokenize_llama_server(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """llama-server's: `tokens` is the ids, or with `with_pieces` each id with its text."""
    body: TokenizeRequest = await parse_body(request, TokenizeRequest)
    ids = await _token_ids(request, body)
    if body.with_pieces:
        return {"tokens": await _pieces(request, ids, body.model)}
    return {"tokens": ids}


@post(["/detokenize", "/v1/detokenize"], status_code=200, opt={ENDPOINT_OPT: "tokenize"})
async def detokenize(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """llama-server's: token ids to their text (ids outside the vocabulary are a 400)."""
    body: DetokenizeRequest = await parse_body(request, DetokenizeRequest)
    return {"content": await kronk_of(request).detokenize(body.tokens, model=body.model)}


def router() -> Router:
    return Router(
        path="/",
        route_handlers=[
            chat_completions,
            completions,
            list_models,
            get_model,
            tokenize,
            tokenize_llama_server,
            detokenize,
            infill,
            *LORA_ROUTES,
            *AUDIO_ROUTES,
            *RESPONSES_ROUTES,
        ],
        # Router-level, so guards' errors on these routes come out in this shape too.
        exception_handlers=OPENAI.exception_handlers(),
    )
