"""The SDK facade: everything the server does, from plain Python.

The work is done next door: runtime/loading.py wires models, inputs.py coerces
arguments, prompts.py prepares prompts, runtime/chat_stream.py turns engine
events into chat deltas.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar, overload

from kronk_core import inputs
from kronk_core.contract.backend import AdapterInfo
from kronk_core.contract.cache import PromptScope
from kronk_core.contract.errors import (
    InvalidRequestError,
)
from kronk_core.contract.generation import GenerationRequest
from kronk_core.contract.kronk_view import Subscription
from kronk_core.contract.media import Media, check_media
from kronk_core.contract.plugins import create_plugin_manager, registered_plugins
from kronk_core.contract.records import (
    ChatRecord,
    RequestRecord,
    current_request_id,
    new_request_id,
)
from kronk_core.contract.registry import Registry, RegistryKind, fill_registry
from kronk_core.contract.sampling import GRAMMAR_STAGES, reseeded
from kronk_core.contract.templates import RenderOptions
from kronk_core.contract.types import (
    ChatDelta,
    ChatMessage,
    ChatRequest,
    ChatResult,
    CompletionRequest,
)
from kronk_core.inputs import lora_scales
from kronk_core.model_directory import ModelDirectory
from kronk_core.prompts import (
    PreparedChat,
    check_vocabulary,
    media_of,
    prepare_chat,
    prepare_completion,
    prompt_tokens,
    render_options,
)
from kronk_core.runtime.chat_stream import ChatStream, ChatTimes, collect, collect_choices
from kronk_core.runtime.embeddings import EmbeddingInput, EmbeddingResult, RerankResult
from kronk_core.runtime.loading import (
    LoadedModel,
    PooledModel,
    bind_model_settings,
    embedding_model,
    load_model,
    model_config_for,
    model_sections,
    release_if_leased,
    text_model,
)
from kronk_core.runtime.pool import Lease, ModelPool
from kronk_core.settings.config import KronkConfig
from kronk_core.transcription import (
    Task,
    Transcript,
    Transcription,
    check_reads_sound,
    transcript_of,
    transcription_request,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


class Kronk:
    """Load models and run chats on them, with or without a server.

    >>> kronk = Kronk()
    >>> result = asyncio.run(kronk.chat([{"role": "user", "content": "Hi"}], max_tokens=20))
    """

    def __init__(
        self,
        config: KronkConfig | None = None,
        *,
        plugins: Mapping[str, ModuleType | object] | None = None,
    ) -> None:
        config = config or KronkConfig()
        self.plugins = create_plugin_manager(config.plugins, extra=dict(plugins or {}))
        self.hook = self.plugins.hook
        self.model_sections = model_sections(self.plugins)
        self._registries: dict[str, Registry[Any]] = {}
        self._registries_lock = threading.Lock()
        # Plugin sections of configured models are checked now, before anything loads.
        self.config = config.model_copy(
            update={
                "models": {
                    model_id: bind_model_settings(self, model)
                    for model_id, model in config.models.items()
                }
            }
        )
        self.pool: ModelPool[PooledModel] = ModelPool(
            self._load, capacity=self.config.models_in_cache, ttl=self.config.cache_ttl
        )
        self.models = ModelDirectory(self, self.pool)
        log.info("plugins registered: %s", ", ".join(registered_plugins(self.plugins)))

    @overload
    def registry(self, kind: RegistryKind[T]) -> Registry[T]: ...

    @overload
    def registry(self, kind: str) -> Registry[Any]: ...

    def registry(self, kind: RegistryKind[T] | str) -> Registry[Any]:
        """The named registry `kind` (`CACHE_STRATEGIES`, `TEMPLATE_PROCESSORS`, or one a
        plugin defines; or its name), filled by `kronk_register_<name>` on first use."""
        name = kind if isinstance(kind, str) else kind.name
        with self._registries_lock:
            if name not in self._registries:
                self._registries[name] = fill_registry(self.plugins, name, kronk=self)
            return self._registries[name]

    @property
    def disabled_plugins(self) -> list[str]:
        """The plugins configuration left out."""
        return self.plugins.disabled

    def subscribe(self, observer: object) -> Subscription:
        """Call `observer`'s hook implementations (`kronk_chat_finished`, ...) too, until
        the subscription is cancelled: a server's metrics or spans, for as long as it runs."""
        return Subscription(self.plugins, observer)

    # ---- models ------------------------------------------------------------

    def loaded_models(self) -> list[LoadedModel]:
        """The loaded text models (embedding models are in `pool` too)."""
        return [model for model in self.pool.models() if isinstance(model, LoadedModel)]

    def get_loaded(self, model_id: str | None = None) -> LoadedModel | None:
        """The loaded text model, if it is loaded (it is not leased: for reports and tests)."""
        loaded = self.pool.get(self.models.canonical(model_id))
        return loaded if isinstance(loaded, LoadedModel) else None

    def load(self, model_id: str | None = None, *, keep: bool = False) -> PooledModel:
        """Load a model into the pool (once, even when called concurrently).

        `keep` exempts it from cache_ttl expiry (the least-recently-used rule still applies).
        """
        lease = self._lease_now(model_id, keep=keep)
        lease.release()
        return lease.model

    async def aload(self, model_id: str | None = None) -> PooledModel:
        lease = await self.lease(model_id)
        lease.release()
        return lease.model

    async def lease(self, model_id: str | None = None) -> Lease[PooledModel]:
        """Hold a model in the pool (loading it if needed) until the lease is released.

        `model_id` may be an alias or a reference (see `resolve`), which may pull it first.
        """
        lease = self.pool.try_lease(self.models.canonical(model_id))
        if lease is not None:
            return lease
        waiting = asyncio.ensure_future(asyncio.to_thread(self._lease_now, model_id))
        try:
            return await asyncio.shield(waiting)
        except asyncio.CancelledError:
            # The load goes on in its thread; whatever it leases must not stay held.
            waiting.add_done_callback(release_if_leased)
            raise

    def _lease_now(self, name: str | None, *, keep: bool = False) -> Lease[PooledModel]:
        """Resolve `name`, then lease its model, loading it if needed (blocking)."""
        return self.pool.lease(
            self.models.resolve(name), wait=self.config.queue_wait_seconds, keep=keep
        )

    def _load(self, model_id: str) -> PooledModel:
        started = time.monotonic()
        loaded = load_model(self, model_id, self._request_finished)
        try:
            self.hook.kronk_model_loaded(
                model_config=loaded.config,
                model_info=loaded.info,
                seconds=time.monotonic() - started,
            )
        except Exception:
            log.exception("a kronk_model_loaded hook failed")
        return loaded

    def unload(self, model_id: str | None = None) -> bool:
        """Unload a model now; a text model's running requests end with an error event."""
        return self.pool.unload(self.models.canonical(model_id))

    async def aunload(self, model_id: str | None = None) -> bool:
        """unload() off the event loop (closing a model waits for its threads)."""
        return await asyncio.to_thread(self.unload, model_id)

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> Kronk:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- chat --------------------------------------------------------------

    def render_options(
        self, request: ChatRequest, *, add_generation_prompt: bool = True
    ) -> RenderOptions:
        return render_options(request, add_generation_prompt=add_generation_prompt)

    async def start_chat(
        self, request: ChatRequest, *, wait: float | None = None, subject: str | None = None
    ) -> ChatStream:
        """Validate, render, check the context and queue the request.

        Everything that can fail before the first token fails here (unknown
        model, template error, context overflow, queue full), so a server can
        answer with a proper status before it starts a stream. `subject` is
        who asks (a server with authentication passes the token's subject):
        what the cache learns from one subject never reaches another's prompt.
        """
        _one_choice(request, "start_chat")
        return (await self.start_choices(request, wait=wait, subject=subject))[0]

    async def start_choices(
        self,
        request: ChatRequest | CompletionRequest,
        *,
        wait: float | None = None,
        subject: str | None = None,
    ) -> list[ChatStream]:
        """`start_chat` (or `start_completion`) for the request's `n` choices: a stream each.

        The prompt is prepared once, and the choices run side by side in slots of their own
        (n may not exceed the model's n_seq_max): the first prefills the prompt, the others
        copy it (kronk_core.runtime.engine). A seeded request's choice i draws with seed + i.
        """
        if request.n < 1:
            raise InvalidRequestError("n must be at least 1", param="n")
        if isinstance(request, CompletionRequest):
            inputs.check_completion(request)
            completion = request
            return await self._start(
                request.model, lambda loaded: prepare_completion(loaded, completion), wait
            )
        inputs.check_chat(request)
        check_media(media_of(request.messages), self.config.media)
        chat = request
        return await self._start(
            request.model,
            lambda loaded: prepare_chat(loaded, chat, PromptScope(subject=subject)),
            wait,
            tools=len(request.tools),
            parallel_tool_calls=request.parallel_tool_calls,
        )

    async def start_completion(
        self, request: CompletionRequest, *, wait: float | None = None
    ) -> ChatStream:
        """Queue a raw-text completion (no chat template); its deltas hold content only.

        Fails before the first token as `start_chat` does; no cache strategy adds to
        the prompt, so there is no subject to keep apart.
        """
        _one_choice(request, "start_completion")
        return (await self.start_choices(request, wait=wait))[0]

    async def _start(
        self,
        model: str | None,
        prepare: Callable[[LoadedModel], PreparedChat],
        wait: float | None,
        *,
        tools: int = 0,
        parallel_tool_calls: bool = True,
    ) -> list[ChatStream]:
        started = time.monotonic()
        request_id = current_request_id.get() or new_request_id()
        # The lease keeps the model loaded until the request is queued; from then
        # on the engine's work keeps the pool from unloading it.
        with text_model(await self.lease(model)) as loaded:
            leased = time.monotonic()
            # Rendering, tokenizing and compiling a grammar take long for a long prompt or a
            # big schema (tens of seconds for 10,000 messages): never on the event loop.
            prepared = await self._using(loaded, partial(_prepare_for_engine, loaded, prepare))
            generations = _choices(prepared.generation, 1 + len(prepared.more_parsers))
            streams = await loaded.engine.submit_choices(
                generations,
                wait=self.config.queue_wait_seconds if wait is None else wait,
                request_id=request_id,
            )
        parsers = (prepared.parser, *prepared.more_parsers)
        return [
            ChatStream(
                loaded.id,
                stream,
                parser,
                len(prepared.generation.prompt_tokens),
                prepared.dropped_tokens,
                parallel_tool_calls,
                ChatTimes(
                    request_id if index == 0 else f"{request_id}-{index}",
                    started,
                    leased,
                    stream.enqueued_at,
                    tools,
                ),
                self._chat_finished,
                prepared.prompt_text,
            )
            for index, (stream, parser) in enumerate(zip(streams, parsers, strict=True))
        ]

    async def chat_stream(
        self, messages: Sequence[ChatMessage | Mapping[str, Any]], **params: Any
    ) -> AsyncIterator[ChatDelta]:
        """Stream a chat answer as deltas; the last one carries finish_reason and usage."""
        stream = await self.start_chat(self.chat_request(messages, **params))
        async for delta in stream:
            yield delta

    async def chat(
        self, messages: Sequence[ChatMessage | Mapping[str, Any]], **params: Any
    ) -> ChatResult:
        """Run a chat to the end and return the whole answer."""
        return await collect(await self.start_chat(self.chat_request(messages, **params)))

    async def chat_choices(
        self, messages: Sequence[ChatMessage | Mapping[str, Any]], n: int, **params: Any
    ) -> list[ChatResult]:
        """Run a chat's `n` choices to the end side by side (`start_choices`); the answers
        in choice order. Each one's usage counts the prompt: it is prefilled once."""
        request = self.chat_request(messages, n=n, **params)
        return await collect_choices(await self.start_choices(request))

    # Build a ChatRequest from keyword arguments; sampling keys as in the manual.
    chat_request = staticmethod(inputs.chat_request)

    async def complete_stream(
        self, prompt: str | Sequence[int], **params: Any
    ) -> AsyncIterator[ChatDelta]:
        """Stream a raw-text completion of `prompt` (text or token ids) as deltas."""
        stream = await self.start_completion(self.completion_request(prompt, **params))
        async for delta in stream:
            yield delta

    async def complete(self, prompt: str | Sequence[int], **params: Any) -> ChatResult:
        """Run a raw-text completion of `prompt` (text or token ids) to the end."""
        return await collect(await self.start_completion(self.completion_request(prompt, **params)))

    # Build a CompletionRequest from keyword arguments; sampling keys as in the manual.
    completion_request = staticmethod(inputs.completion_request)

    async def count_prompt_tokens(
        self, request: ChatRequest, *, add_generation_prompt: bool, subject: str | None = None
    ) -> int:
        """The prompt's length as `start_chat` with the same `subject` would run it."""
        tokens = await self.prompt_tokens(
            request, add_generation_prompt=add_generation_prompt, subject=subject
        )
        return len(tokens)

    async def prompt_tokens(
        self, request: ChatRequest, *, add_generation_prompt: bool, subject: str | None = None
    ) -> list[int]:
        """The prompt's token ids as `start_chat` with the same `subject` would run it."""
        inputs.check_chat(request)
        check_media(media_of(request.messages), self.config.media)
        scope = PromptScope(remember=False, subject=subject)
        with text_model(await self.lease(request.model)) as loaded:
            tokens = partial(
                prompt_tokens, loaded, request, scope, add_generation_prompt=add_generation_prompt
            )
            return list(await self._using(loaded, tokens))

    async def tokenize(
        self,
        text: str,
        *,
        model: str | None = None,
        add_special: bool = False,
        parse_special: bool = True,
    ) -> list[int]:
        """Tokenize raw text: by default no BOS added, special-token text parsed as special
        tokens (`add_special` adds the model's BOS, `parse_special` off reads it as text)."""
        with await self.lease(model) as loaded:
            tokenize = partial(
                loaded.model.tokenize, text, add_special=add_special, parse_special=parse_special
            )
            return await self._using(loaded, tokenize)

    async def token_pieces(self, tokens: Sequence[int], *, model: str | None = None) -> list[bytes]:
        """Each token's text as bytes (special tokens as their text): a character the
        tokenizer split is split over its tokens' pieces, which are then not valid UTF-8."""
        with text_model(await self.lease(model)) as loaded:
            check_vocabulary(loaded, tokens, "tokens")
            return [loaded.model.token_bytes(token, special=True) for token in tokens]

    async def detokenize(self, tokens: Sequence[int], *, model: str | None = None) -> str:
        """The text of token ids, their pieces joined (as llama-server's /detokenize); bytes
        that are not valid UTF-8 (a cut character) read as U+FFFD."""
        pieces = await self.token_pieces(tokens, model=model)
        return b"".join(pieces).decode("utf-8", errors="replace")

    async def lora_adapters(self, *, model: str | None = None) -> list[AdapterInfo]:
        """The model's LoRA adapters, each with the scale requests now get: the loaded
        model's, else its config's (a listing loads nothing)."""
        model_id = self.models.resolve(model, pull=False)
        loaded = self.get_loaded(model_id)
        if loaded is not None:
            adapters = loaded.info.adapters
            return [replace(a, scale=s) for a, s in zip(adapters, loaded.lora_scales, strict=True)]
        config = model_config_for(self, model_id)
        return [AdapterInfo(i, str(a.path), a.scale) for i, a in enumerate(config.lora)]

    async def set_lora_adapters(
        self, scales: Mapping[int, float], *, model: str | None = None
    ) -> list[AdapterInfo]:
        """Scales for the model's later requests (those not listed: 0), as llama-server's
        POST /lora-adapters, until it is unloaded; what `lora_adapters` then says."""
        checked = lora_scales(scales)
        assert checked is not None
        with text_model(await self.lease(model)) as loaded:
            loaded.set_lora_scales(checked)
        return await self.lora_adapters(model=model)

    async def _using(self, model: PooledModel, work: Callable[[], T]) -> T:
        """`work()` in a worker thread, while the caller's lease holds `model`. A caller
        cancelled meanwhile releases its lease, so the thread, which goes on with the
        model (tokenizing, compiling), holds a lease of its own until it is done."""
        running = asyncio.ensure_future(asyncio.to_thread(work))
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            held = self.pool.try_lease(model.id)
            if held is not None:
                running.add_done_callback(lambda _: held.release())
            raise

    # ---- speech to text -----------------------------------------------------

    async def start_transcription(
        self,
        transcription: Transcription,
        *,
        model: str | None = None,
        subject: str | None = None,
        **params: Any,
    ) -> ChatStream:
        """Queue the transcript of a sound (kronk_core.transcription) on a model whose
        projector reads sound; the stream's deltas are its text. `params`: temperature,
        max_tokens, logprobs."""
        model_id = self.models.canonical(model)
        if model_id not in self.models.ids():
            raise self.models.unknown(model_id)
        check_reads_sound(model_id, self.models.media(model_id))
        request = transcription_request(transcription, model=model_id, **params)
        return await self.start_chat(request, subject=subject)

    async def transcribe(
        self,
        audio: Media | bytes | str | Path,
        *,
        model: str | None = None,
        task: Task = "transcribe",
        language: str | None = None,
        prompt: str | None = None,
        **params: Any,
    ) -> Transcript:
        """What is said in a sound (its bytes, a file, or `Media`), or with
        task="translate" its English translation; `params` as `start_transcription`."""
        if isinstance(audio, Media):
            media = audio
        elif isinstance(audio, bytes):
            media = Media.from_bytes(audio, where="file")
        else:
            media = Media.from_path(audio)
        transcription = Transcription(media, task=task, language=language, prompt=prompt)
        stream = await self.start_transcription(transcription, model=model, **params)
        result = await collect(stream)
        return transcript_of(transcription, result, temperature=params.get("temperature", 0.0))

    # ---- embeddings and reranking -------------------------------------------

    async def embed(
        self,
        input: EmbeddingInput | Sequence[EmbeddingInput],
        *,
        model: str | None = None,
        dimensions: int | None = None,
        truncate: bool = False,
    ) -> EmbeddingResult:
        """Unit-length embeddings of a text, token ids, or a list of either, in input order.

        `dimensions` cuts vectors short (Matryoshka models only); `truncate`
        shortens inputs longer than the context instead of failing.
        """
        items = inputs.embedding_inputs(input)
        with embedding_model(await self.lease(model)) as loaded:
            return await asyncio.to_thread(
                loaded.embed, items, dimensions=dimensions, truncate=truncate
            )

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        model: str | None = None,
        top_n: int | None = None,
    ) -> RerankResult:
        """Score each document's relevance to the query; the best `top_n` (default all) first."""
        if not documents:
            raise InvalidRequestError("documents must not be empty", param="documents")
        if top_n is not None and top_n < 1:
            raise InvalidRequestError("top_n must be at least 1", param="top_n")
        with embedding_model(await self.lease(model)) as loaded:
            return await asyncio.to_thread(loaded.rerank, query, documents, top_n=top_n)

    def _request_finished(self, record: RequestRecord) -> None:
        try:
            self.hook.kronk_request_finished(record=record)
        except Exception:
            log.exception("a kronk_request_finished hook failed")

    def _chat_finished(self, record: ChatRecord) -> None:
        try:
            self.hook.kronk_chat_finished(record=record)
        except Exception:
            log.exception("a kronk_chat_finished hook failed")


def _prepare_for_engine(
    loaded: LoadedModel, prepare: Callable[[LoadedModel], PreparedChat]
) -> PreparedChat:
    """The prepared request with its sampler stages, any grammar among them compiled by the
    backend now, so that the engine thread only copies it."""
    prepared = prepare(loaded)
    generation = prepared.generation
    stages = loaded.engine.sampler_stages(generation.sampling)
    if any(isinstance(stage, GRAMMAR_STAGES) for stage in stages):
        stages = loaded.model.compile_stages(stages)
    return replace(prepared, generation=replace(generation, stages=tuple(stages)))


def _one_choice(request: ChatRequest | CompletionRequest, method: str) -> None:
    if request.n != 1:
        raise InvalidRequestError(
            f"n: {method} runs one choice; start_choices (or chat_choices) runs n={request.n}",
            param="n",
        )


def _choices(generation: GenerationRequest, n: int) -> list[GenerationRequest]:
    """The request's n choices: choice i of a seeded one draws with seed + i (its stages
    reseeded, any grammar among them compiled once), so they differ and each repeats."""
    choices = [generation]
    seed = generation.sampling.seed
    for index in range(1, n):
        sampling = generation.sampling
        if seed is not None:
            sampling = replace(sampling, seed=seed + index)
        stages = generation.stages
        if stages is not None and seed is not None:
            stages = tuple(reseeded(stages, index))
        choices.append(replace(generation, sampling=sampling, stages=stages))
    return choices


__all__ = [
    "ChatStream",
    "Kronk",
    "LoadedModel",
    "PooledModel",
    "collect",
    "collect_choices",
]
