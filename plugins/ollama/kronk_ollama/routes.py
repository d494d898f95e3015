"""Ollama routes: chat, generate, embed, the model listings (tags, ps, show, version), and
pulling and deleting models (pull, delete)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, Router, delete, get, post
from litestar.response import Stream

from kronk_api.contract import (
    ADMIN,
    AUTHENTICATED,
    ENDPOINT_OPT,
    PUBLIC,
    delete_model_files_of,
    kronk_of,
    parse_body,
    receive,
)
from kronk_core.contract import ChatStream, Kronk, KronkError
from kronk_ollama.answers import Answer, nanoseconds
from kronk_ollama.errors import NDJSON, OLLAMA, ndjson_line
from kronk_ollama.models import running, show, tags
from kronk_ollama.schemas import (
    ChatBody,
    DeleteBody,
    EmbedBody,
    EmbeddingsBody,
    GenerateBody,
    OllamaGeneration,
    OllamaRequest,
    PullBody,
    ShowBody,
)
from kronk_ollama.schemas import model_id as model_id_of

log = logging.getLogger(__name__)

# The Ollama API level these routes follow; clients compare it against the versions that
# introduced the features they use (structured outputs, tools, think).
OLLAMA_VERSION = "0.12.0"


def _keep_alive(kronk: Kronk, model_id: str, body: OllamaRequest) -> None:
    """The request's keep_alive, applied to its (loaded) model; unset leaves cache_ttl."""
    given, seconds = body.keep_alive_for()
    if given:
        kronk.pool.keep_alive(model_id, seconds)


async def _answer(
    request: Request[Any, Any, Any], body: OllamaGeneration, stream: ChatStream, answer: Answer
) -> Response[Any] | Stream:
    kronk = kronk_of(request)
    _keep_alive(kronk, stream.model_id, body)
    if body.stream:
        return await OLLAMA.open_stream(
            request,
            aiter(stream),
            lambda deltas: answer.lines(stream, deltas),
            keepalive_frame=answer.keepalive(),
        )
    whole = await OLLAMA.respond(request, answer.whole(stream))
    return whole if isinstance(whole, Response) else Response(whole)


async def _load_only(
    request: Request[Any, Any, Any], body: OllamaGeneration, answer: Answer
) -> dict[str, Any]:
    """A request with nothing to generate loads its model; with keep_alive 0 it unloads it
    (once idle), as `ollama run` and `ollama stop` use it."""
    kronk = kronk_of(request)
    given, seconds = body.keep_alive_for()
    if given and seconds == 0:
        model_id = kronk.models.canonical(body.model_id)
        if kronk.pool.get(model_id) is None and model_id not in kronk.models.ids():
            raise kronk.models.unknown(body.model_id)
        kronk.pool.keep_alive(model_id, 0)
        reason = "unload"
    else:
        await kronk.aload(body.model_id)
        _keep_alive(kronk, kronk.models.canonical(body.model_id), body)
        reason = "load"
    took = nanoseconds(time.monotonic() - answer.started)
    return {**answer.piece(""), "done": True, "done_reason": reason, "total_duration": took}


@post("/api/chat", status_code=200, opt={ENDPOINT_OPT: "ollama-chat"})
async def chat(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
    """Ollama chat: a conversation in, the model's message out, streamed as JSON lines unless
    `stream` is false."""
    started = time.monotonic()
    received = await receive(request, ChatBody)
    body = received.body
    answer = Answer(body.model, chat=True, started=started, logprobs=body.wants_logprobs)
    if not body.messages:
        return Response(await _load_only(request, body, answer))
    chat = body.to_core(received.sources)
    stream = await received.kronk.start_chat(chat, subject=received.subject)
    return await _answer(request, body, stream, answer)


@post("/api/generate", status_code=200, opt={ENDPOINT_OPT: "ollama-generate"})
async def generate(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
    """Ollama generate: a prompt in, its completion out, streamed as JSON lines unless `stream` is
    false."""
    started = time.monotonic()
    received = await receive(request, GenerateBody)
    body, kronk = received.body, received.kronk
    answer = Answer(body.model, chat=False, started=started, logprobs=body.wants_logprobs)
    if not body.prompt and not body.images:
        return Response(await _load_only(request, body, answer))
    if body.raw:
        stream = await kronk.start_completion(body.to_completion())
    else:
        chat = body.to_chat(received.sources)
        stream = await kronk.start_chat(chat, subject=received.subject)
    return await _answer(request, body, stream, answer)


async def _embed(
    request: Request[Any, Any, Any], body: OllamaRequest, texts: list[str], **params: Any
) -> tuple[list[list[float]], dict[str, Any]]:
    """The vectors, and Ollama's counts and timings: a load first if the model needs one."""
    started = time.monotonic()
    kronk = kronk_of(request)
    load = 0.0
    if kronk.pool.get(kronk.models.canonical(body.model_id)) is None:
        await kronk.aload(body.model_id)
        load = time.monotonic() - started
    result = await kronk.embed(texts, model=body.model_id, **params)
    _keep_alive(kronk, result.model, body)
    stats = {
        "total_duration": nanoseconds(time.monotonic() - started),
        "load_duration": nanoseconds(load),
        "prompt_eval_count": result.prompt_tokens,
    }
    return result.vectors, stats


@post("/api/embed", status_code=200, opt={ENDPOINT_OPT: "ollama-embed"})
async def embed(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Ollama embed: one vector per input."""
    body = await parse_body(request, EmbedBody)
    vectors, stats = await _embed(
        request, body, body.texts(), dimensions=body.dimensions, truncate=body.truncate
    )
    return {"model": body.model, "embeddings": vectors, **stats}


@post("/api/embeddings", status_code=200, opt={ENDPOINT_OPT: "ollama-embed"})
async def embeddings(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Ollama's older embeddings route: one vector for one prompt."""
    body = await parse_body(request, EmbeddingsBody)
    vectors, _ = await _embed(request, body, [body.prompt], truncate=True)
    return {"embedding": vectors[0]}


@get("/api/version", opt={ENDPOINT_OPT: PUBLIC})
async def version() -> dict[str, str]:
    """The version Ollama clients check."""
    return {"version": OLLAMA_VERSION}


@get("/api/tags", opt={ENDPOINT_OPT: AUTHENTICATED})
async def list_models(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Ollama tags: the models this server can serve, with their sizes and details."""
    return await asyncio.to_thread(tags, kronk_of(request))


@get("/api/ps", opt={ENDPOINT_OPT: AUTHENTICATED})
async def running_models(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Ollama ps: the loaded models, their memory and when they unload."""
    return await asyncio.to_thread(running, kronk_of(request))


@post("/api/show", status_code=200, opt={ENDPOINT_OPT: AUTHENTICATED})
async def show_model(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Ollama show: one model's details, parameters, template and what its file says."""
    body = await parse_body(request, ShowBody)
    kronk = kronk_of(request)
    if body.model_id not in [*kronk.models.ids(), *kronk.models.aliases()]:
        raise kronk.models.unknown(body.model_id)
    return await asyncio.to_thread(show, kronk, kronk.models.canonical(body.model_id))


async def _pull(kronk: Kronk, name: str) -> str:
    """The id of the model `name` names, pulled first where it is not on disk (by the
    plugin that knows such references: the catalog, for Hugging Face's)."""
    found = await asyncio.to_thread(kronk.models.resolve, model_id_of(name), pull=True)
    if found not in kronk.models.ids():
        raise kronk.models.unknown(name)
    return found


async def _pull_lines(kronk: Kronk, name: str) -> AsyncIterator[bytes]:
    """Ollama's progress lines: what is pulled, then `success` or the error. (Per-file
    byte counts are the catalog's own pull route's, /v1/kronk/pulls.)"""
    yield ndjson_line({"status": f"pulling {name}"})
    try:
        pulled = await _pull(kronk, name)
    except KronkError as error:
        yield OLLAMA.stream_error(error)
        return
    except Exception as error:  # a download gone wrong: said in the stream, not a trace
        log.exception("pulling %s failed", name)
        yield ndjson_line({"error": f"pulling {name} failed: {error}"})
        return
    yield ndjson_line({"status": f"pulled {pulled}"})
    yield ndjson_line({"status": "success"})


@post("/api/pull", status_code=200, opt={ENDPOINT_OPT: ADMIN})
async def pull_model(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
    """Ollama pull: fetch a model by reference, streaming progress as JSON lines unless `stream` is
    false."""
    body = await parse_body(request, PullBody)
    kronk = kronk_of(request)
    if body.stream:
        return Stream(_pull_lines(kronk, body.given_name), media_type=NDJSON)
    await _pull(kronk, body.given_name)
    return Response({"status": "success"})


@delete("/api/delete", status_code=200, opt={ENDPOINT_OPT: ADMIN})
async def delete_model(request: Request[Any, Any, Any]) -> Response[bytes]:
    """`ollama rm`: the model's files, as `kronk model rm --force` (a loaded model is
    unloaded first, as Ollama stops it)."""
    body = await parse_body(request, DeleteBody)
    kronk = kronk_of(request)
    await delete_model_files_of(kronk, kronk.models.canonical(body.model_id), force=True)
    return Response(b"")  # Ollama's answer: 200, nothing more


def router() -> Router:
    return Router(
        path="/",
        route_handlers=[
            chat,
            generate,
            embed,
            embeddings,
            version,
            list_models,
            running_models,
            show_model,
            pull_model,
            delete_model,
        ],
        # Router-level, so guards' errors on these routes come out in Ollama's shape too.
        exception_handlers=OLLAMA.exception_handlers(),
    )
