"""The SDK facade: everything the server does, from plain Python.

The work is done next door: loading.py wires models, inputs.py coerces
arguments, prompts.py prepares prompts, chat_stream.py turns engine events
into chat deltas.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from kronk_core import inputs
from kronk_core.chat_stream import ChatStream, ChatTimes, collect
from kronk_core.config import DEFAULT_MODEL_ID, KronkConfig
from kronk_core.embeddings import EmbeddingInput, EmbeddingResult, RerankResult
from kronk_core.errors import InvalidRequestError, KronkError
from kronk_core.events import ChatRecord, RequestRecord, current_request_id, new_request_id
from kronk_core.loading import (
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
from kronk_core.media import MediaKind, check_media
from kronk_core.memory import Device, MemoryEstimate
from kronk_core.models import known_model_ids
from kronk_core.plugins import create_plugin_manager, registered_plugins
from kronk_core.pool import Lease, ModelPool
from kronk_core.prompts import (
    PreparedChat,
    count_prompt,
    media_of,
    prepare_chat,
    prepare_completion,
    render_options,
)
from kronk_core.registry import Registry
from kronk_core.registry import collect as collect_registry
from kronk_core.slots import PromptScope
from kronk_core.templates import RenderOptions
from kronk_core.types import ChatDelta, ChatMessage, ChatRequest, ChatResult, CompletionRequest

log = logging.getLogger(__name__)


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
        log.info("plugins registered: %s", ", ".join(registered_plugins(self.plugins)))

    def registry(self, kind: str) -> Registry[Any]:
        """The named registry `kind` (`cache_strategies`, `template_processors`, or one a
        plugin defines), filled by the `kronk_register_<kind>` hook on first use."""
        with self._registries_lock:
            if kind not in self._registries:
                self._registries[kind] = collect_registry(self.plugins, kind, kronk=self)
            return self._registries[kind]

    # ---- models ------------------------------------------------------------

    def model_ids(self) -> list[str]:
        """Every model this instance can serve: configured, provided by plugins, installed,
        and the default."""
        return known_model_ids(self.config, self.provided_models())

    def provided_models(self) -> dict[str, Mapping[str, Any]]:
        """The models plugins provide (`kronk_models`) with their settings, by id.

        Asked anew each time: a plugin answers from what is on disk now (a
        catalog model pulled a second ago is there). The first answer for an id wins.
        """
        found: dict[str, Mapping[str, Any]] = {}
        for models in self.hook.kronk_models(kronk=self):
            for model_id, settings in (models or {}).items():
                found.setdefault(model_id, settings)
        return found

    def devices(self) -> list[Device]:
        """Every device the backends can place models on, with free and total memory."""
        return [device for answer in self.hook.kronk_devices() for device in answer]

    def memory_estimate(self, model_id: str | None = None) -> MemoryEstimate | None:
        """What loading the model would take and where (None: its backend cannot say)."""
        config = model_config_for(self, model_id or self.config.default_model)
        estimate: MemoryEstimate | None = self.hook.kronk_memory_estimate(model_config=config)
        return estimate

    def model_media(self, model_id: str | None = None) -> frozenset[MediaKind]:
        """What the model's projector reads (images, sounds): the loaded model's, else its
        projector file's as the backend's memory estimate reads it; empty without one."""
        model_id = model_id or self.config.default_model
        loaded = self.get_loaded(model_id)
        if loaded is not None:
            return loaded.info.media
        try:
            config = model_config_for(self, model_id)
            if config.projector_path is None:
                return frozenset()
            estimate = self.memory_estimate(model_id)
        except KronkError:
            return frozenset()
        return frozenset(MediaKind(kind) for kind in estimate.media) if estimate else frozenset()

    def loaded_models(self) -> list[LoadedModel]:
        """The loaded text models (embedding models are in `pool` too)."""
        return [model for model in self.pool.models() if isinstance(model, LoadedModel)]

    def get_loaded(self, model_id: str | None = None) -> LoadedModel | None:
        """The loaded text model, if it is loaded (it is not leased: for reports and tests)."""
        loaded = self.pool.get(model_id or self.config.default_model)
        return loaded if isinstance(loaded, LoadedModel) else None

    def load(self, model_id: str | None = None, *, keep: bool = False) -> PooledModel:
        """Load a model into the pool (once, even when called concurrently).

        `keep` exempts it from cache_ttl expiry (the least-recently-used rule still applies).
        """
        lease = self.pool.lease(
            model_id or self.config.default_model, wait=self.config.queue_wait_seconds, keep=keep
        )
        lease.release()
        return lease.model

    async def aload(self, model_id: str | None = None) -> PooledModel:
        lease = await self.lease(model_id)
        lease.release()
        return lease.model

    async def lease(self, model_id: str | None = None) -> Lease[PooledModel]:
        """Hold a model in the pool (loading it if needed) until the lease is released."""
        model_id = model_id or self.config.default_model
        lease = self.pool.try_lease(model_id)
        if lease is not None:
            return lease
        waiting = asyncio.ensure_future(
            asyncio.to_thread(self.pool.lease, model_id, wait=self.config.queue_wait_seconds)
        )
        try:
            return await asyncio.shield(waiting)
        except asyncio.CancelledError:
            # The load goes on in its thread; whatever it leases must not stay held.
            waiting.add_done_callback(release_if_leased)
            raise

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
        return self.pool.unload(model_id or self.config.default_model)

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
        inputs.check_chat(request)
        media = media_of(request.messages)
        check_media(media, self.config.media)
        return await self._start(
            request.model,
            lambda loaded: prepare_chat(loaded, request, PromptScope(subject=subject)),
            wait,
            tools=len(request.tools),
            parallel_tool_calls=request.parallel_tool_calls,
            decodes_media=bool(media),
        )

    async def start_completion(
        self, request: CompletionRequest, *, wait: float | None = None
    ) -> ChatStream:
        """Queue a raw-text completion (no chat template); its deltas hold content only.

        Fails before the first token as `start_chat` does; no cache strategy adds to
        the prompt, so there is no subject to keep apart.
        """
        inputs.check_completion(request)
        return await self._start(
            request.model, lambda loaded: prepare_completion(loaded, request), wait
        )

    async def _start(
        self,
        model: str | None,
        prepare: Callable[[LoadedModel], PreparedChat],
        wait: float | None,
        *,
        tools: int = 0,
        parallel_tool_calls: bool = True,
        decodes_media: bool = False,
    ) -> ChatStream:
        started = time.monotonic()
        request_id = current_request_id.get() or new_request_id()
        # The lease keeps the model loaded until the request is queued; from then
        # on the engine's work keeps the pool from unloading it.
        with text_model(await self.lease(model)) as loaded:
            leased = time.monotonic()
            # Decoding and resizing images is work for a thread, not for the event loop.
            if decodes_media:
                prepared = await asyncio.to_thread(prepare, loaded)
            else:
                prepared = prepare(loaded)
            stream = await loaded.engine.submit(
                prepared.generation,
                wait=self.config.queue_wait_seconds if wait is None else wait,
                request_id=request_id,
            )
        times = ChatTimes(request_id, started, leased, stream.enqueued_at, tools)
        return ChatStream(
            loaded.id,
            stream,
            prepared.parser,
            len(prepared.generation.prompt_tokens),
            prepared.dropped_tokens,
            parallel_tool_calls,
            times,
            self._chat_finished,
        )

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
        inputs.check_chat(request)
        media = media_of(request.messages)
        check_media(media, self.config.media)
        scope = PromptScope(remember=False, subject=subject)
        with text_model(await self.lease(request.model)) as loaded:
            count = functools.partial(
                count_prompt, loaded, request, scope, add_generation_prompt=add_generation_prompt
            )
            return await asyncio.to_thread(count) if media else count()

    async def tokenize(self, text: str, *, model: str | None = None) -> list[int]:
        """Tokenize raw text: no BOS added, special-token text parsed as special tokens."""
        with await self.lease(model) as loaded:
            return loaded.model.tokenize(text, add_special=False, parse_special=True)

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


__all__ = [
    "DEFAULT_MODEL_ID",
    "ChatStream",
    "Kronk",
    "LoadedModel",
    "PooledModel",
    "collect",
]
