"""The SDK facade: everything the server does, from plain Python."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from kronk_core.backend import ModelInfo, TextModel
from kronk_core.config import (
    DEFAULT_MODEL_ID,
    ContextOverflow,
    KronkConfig,
    ModelConfig,
    SamplingConfig,
)
from kronk_core.embeddings import (
    EmbeddingInput,
    EmbeddingResult,
    LoadedEmbeddingModel,
    RerankResult,
    describe_capabilities,
)
from kronk_core.engine import Engine, GenerationStream
from kronk_core.errors import (
    CapabilityError,
    ContextOverflowError,
    InvalidRequestError,
    KronkError,
    ModelLoadError,
)
from kronk_core.events import RequestRecord
from kronk_core.memory import Device, MemoryEstimate
from kronk_core.models import known_model_ids, resolve_model_config
from kronk_core.plugins import create_plugin_manager, registered_plugins
from kronk_core.pool import Lease, ModelPool
from kronk_core.sampling import SamplerStage, resolve_sampling
from kronk_core.templates import OutputParser, RenderOptions, TemplateProcessor
from kronk_core.types import (
    DEFAULT_MAX_TOKENS,
    ChatDelta,
    ChatMessage,
    ChatRequest,
    ChatResult,
    Finished,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    TokenLogprob,
    ToolCall,
    ToolChoice,
    ToolSpec,
    Usage,
)

log = logging.getLogger(__name__)


@dataclass(eq=False)
class LoadedModel:
    """A model with its engine and template processor, ready for requests."""

    config: ModelConfig
    model: TextModel
    engine: Engine
    template: TemplateProcessor
    # SPC: system prompts seen, so a request without one can reuse the only one.
    system_prompts: OrderedDict[str, None] = field(default_factory=OrderedDict)

    @property
    def id(self) -> str:
        return self.config.id

    @property
    def info(self) -> ModelInfo:
        return self.model.info

    @property
    def busy(self) -> bool:
        return self.engine.busy

    @property
    def active_requests(self) -> int:
        stats = self.engine.stats()
        return stats.active + stats.queued

    def render(self, messages: Sequence[ChatMessage], options: RenderOptions) -> list[int]:
        """Template then tokenize; the template supplies BOS and other special tokens itself."""
        return self.tokenize_prompt(self.template.render(messages, options))

    def tokenize_prompt(self, prompt: str) -> list[int]:
        return self.model.tokenize(prompt, add_special=False, parse_special=True)

    def close(self) -> None:
        self.engine.close()
        self.model.close()

    def with_cached_system(
        self, messages: Sequence[ChatMessage], *, remember: bool = True
    ) -> Sequence[ChatMessage]:
        """SPC: remember system prompts; prepend the single known one when a request has none.

        `remember` false only looks (token counting must not change what is known).
        """
        first = messages[0]
        if first.role in ("system", "developer") and first.content:
            if not remember:
                return messages
            self.system_prompts[first.content] = None
            self.system_prompts.move_to_end(first.content)
            while len(self.system_prompts) > _SPC_REMEMBERED:
                self.system_prompts.popitem(last=False)
            return messages
        if len(self.system_prompts) == 1:
            return [ChatMessage(role="system", content=next(iter(self.system_prompts))), *messages]
        return messages

    def system_tokens(
        self, messages: Sequence[ChatMessage], options: RenderOptions, prompt: Sequence[int]
    ) -> int:
        """How many leading prompt tokens belong to the system prompt.

        Templates place the system text differently (Gemma folds it into the
        first user turn), so render the system message before two different
        probe turns: the tokens they share, and share with the prompt, are it.
        """
        if messages[0].role not in ("system", "developer"):
            return 0
        probe = RenderOptions(add_generation_prompt=False, template_kwargs=options.template_kwargs)
        first, second = (
            self.render([messages[0], ChatMessage(role="user", content=text)], probe)
            for text in ("A", "Z")
        )
        return min(_shared_prefix(first, second), _shared_prefix(first, prompt))


_SPC_REMEMBERED = 8


def _shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    size = min(len(a), len(b))
    for index in range(size):
        if a[index] != b[index]:
            return index
    return size


class ChatStream:
    """A started chat generation: prompt already checked and queued; iterate for deltas."""

    def __init__(
        self,
        loaded: LoadedModel,
        stream: GenerationStream,
        parser: OutputParser,
        prompt_tokens: int,
        dropped_tokens: int = 0,
        parallel_tool_calls: bool = True,
    ) -> None:
        self._stream = stream
        self._dropped_tokens = dropped_tokens
        self._parser = parser
        self._parallel_tool_calls = parallel_tool_calls
        self.prompt_tokens = prompt_tokens
        self.model_id = loaded.id
        self.created = time.time()

    def __aiter__(self) -> AsyncIterator[ChatDelta]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ChatDelta]:
        calls = 0
        counter = _ReasoningCounter()
        async for event in self._stream:
            if isinstance(event, Finished):
                break
            parts = self._parser.feed(event.text) if event.text else []
            counter.add(event.token_count, parts)
            if event.logprobs:
                head = parts[0] if parts else ChatDelta()
                parts = [_with_logprobs(head, event.logprobs), *parts[1:]]
            for part in parts:
                part, calls = self._limit_calls(part, calls)
                yield part
        else:
            raise KronkError("generation ended without a finish event")
        if event.reason is FinishReason.error:
            raise event.error or KronkError("generation failed")
        parts = self._parser.finish(truncated=event.reason is FinishReason.length)
        counter.add(0, parts)
        counter.close()
        for part in parts:
            part, calls = self._limit_calls(part, calls)
            yield part
        event.usage.dropped_tokens = self._dropped_tokens
        event.usage.reasoning_tokens = counter.reasoning_tokens
        reason = event.reason
        if calls and reason is FinishReason.stop:
            reason = FinishReason.tool_calls
        yield ChatDelta(finish_reason=reason, usage=event.usage, stop_sequence=event.stop_sequence)

    def _limit_calls(self, part: ChatDelta, calls: int) -> tuple[ChatDelta, int]:
        """parallel_tool_calls false: only the first call goes out."""
        if not part.tool_calls:
            return part, calls
        keep = part.tool_calls
        if not self._parallel_tool_calls:
            keep = keep[: max(0, 1 - calls)]
        return replace(part, tool_calls=keep), calls + len(keep)

    def cancel(self) -> None:
        self._stream.cancel()


class _ReasoningCounter:
    """Counts generated tokens whose text came out as reasoning.

    Tokens whose text the parser still holds back count as whatever it
    becomes once released; text it never releases (trailing whitespace) as
    what came before.
    """

    def __init__(self) -> None:
        self.reasoning_tokens = 0
        self._undecided = 0
        self._in_reasoning = False

    def add(self, tokens: int, parts: Sequence[ChatDelta]) -> None:
        self._undecided += tokens
        if not parts:
            return
        self._in_reasoning = any(part.reasoning for part in parts) and not any(
            part.content or part.tool_calls for part in parts
        )
        self.close()

    def close(self) -> None:
        if self._in_reasoning:
            self.reasoning_tokens += self._undecided
        self._undecided = 0


def _with_logprobs(delta: ChatDelta, logprobs: tuple[TokenLogprob, ...]) -> ChatDelta:
    return ChatDelta(
        content=delta.content,
        reasoning=delta.reasoning,
        tool_calls=delta.tool_calls,
        logprobs=delta.logprobs + logprobs,
        finish_reason=delta.finish_reason,
        usage=delta.usage,
    )


def _message(value: ChatMessage | Mapping[str, Any]) -> ChatMessage:
    if isinstance(value, ChatMessage):
        return value
    role = value.get("role")
    if role not in ("system", "developer", "user", "assistant", "tool"):
        raise InvalidRequestError(f"unknown message role {role!r}", param="messages")
    keys = ("content", "name", "tool_call_id", "reasoning_content")
    texts = {key: value.get(key) for key in keys}
    for key, text in texts.items():
        if text is not None and not isinstance(text, str):
            raise InvalidRequestError(f"message {key} must be a string", param="messages")
    calls = value.get("tool_calls") or ()
    if not all(isinstance(call, ToolCall) for call in calls):
        raise InvalidRequestError("message tool_calls must be ToolCall objects", param="messages")
    return ChatMessage(
        role=role,
        content=texts["content"],
        name=texts["name"],
        tool_calls=tuple(calls),
        tool_call_id=texts["tool_call_id"],
        reasoning_content=texts["reasoning_content"],
    )


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
        self.config = config or KronkConfig()
        self.plugins = create_plugin_manager(self.config.plugins, extra=dict(plugins or {}))
        self.hook = self.plugins.hook
        self.pool: ModelPool[PooledModel] = ModelPool(
            self._load, capacity=self.config.models_in_cache, ttl=self.config.cache_ttl
        )
        log.info("plugins registered: %s", ", ".join(registered_plugins(self.plugins)))

    # ---- models ------------------------------------------------------------

    def model_ids(self) -> list[str]:
        """Every model this instance can serve: configured, installed, and the default."""
        return known_model_ids(self.config)

    def devices(self) -> list[Device]:
        """Every device the backends can place models on, with free and total memory."""
        return [device for answer in self.hook.kronk_devices() for device in answer]

    def memory_estimate(self, model_id: str | None = None) -> MemoryEstimate | None:
        """What loading the model would take and where (None: its backend cannot say)."""
        config = resolve_model_config(self.config, model_id or self.config.default_model)
        estimate: MemoryEstimate | None = self.hook.kronk_memory_estimate(model_config=config)
        return estimate

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
            waiting.add_done_callback(_release_if_leased)
            raise

    def _load(self, model_id: str) -> PooledModel:
        config = resolve_model_config(self.config, model_id)
        backend = self.hook.kronk_backend(model_config=config)
        if backend is None:
            raise ModelLoadError(f"no backend plugin can load {config.model_path}")
        started = time.monotonic()
        model = backend.load_model(config)
        if not isinstance(model, TextModel):
            log.info(
                "loaded %s in %.2fs: backend=%s %s contexts=%d ctx=%d",
                model_id,
                time.monotonic() - started,
                backend.name,
                describe_capabilities(model_id, model.info),
                model.info.n_seq_max,
                model.info.n_ctx_per_seq,
            )
            return LoadedEmbeddingModel(config, model)
        text_model = model
        try:
            cache = self.hook.kronk_cache_strategy(
                name=config.cache_strategy, model_config=config, model_info=text_model.info
            )
            if cache is None:
                raise ModelLoadError(f"no plugin provides cache strategy {config.cache_strategy!r}")
            template = self.hook.kronk_template_processor(
                model_info=text_model.info, model_config=config
            )
            if template is None:
                raise ModelLoadError(f"no template processor for {model_id}")
            info = text_model.info

            def stages(params: SamplingParams) -> list[SamplerStage]:
                return list(self.hook.kronk_sampler_stages(params=params, model=info) or [])

            if not stages(SamplingParams()):
                raise ModelLoadError("no plugin provides sampler stages")
            engine = Engine(
                text_model,
                n_batch=config.n_batch,
                queue_depth=config.queue_depth,
                cache=cache,
                sampler_stages=stages,
                on_finished=self._request_finished,
            )
        except BaseException:
            text_model.close()
            raise
        log.info(
            "loaded %s in %.2fs: backend=%s template=%s cache=%s slots=%d ctx/slot=%d",
            model_id,
            time.monotonic() - started,
            backend.name,
            template.name,
            cache.name,
            text_model.info.n_seq_max,
            text_model.info.n_ctx_per_seq,
        )
        return LoadedModel(config=config, model=text_model, engine=engine, template=template)

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
        thinking = request.enable_thinking
        if request.grammar or request.json_schema or _forces_call(request):
            thinking = False  # a grammar applies from the first generated token
        return RenderOptions(
            add_generation_prompt=add_generation_prompt,
            enable_thinking=True if thinking is None else thinking,
            reasoning_effort=request.reasoning_effort,
            tools=() if request.tool_choice.mode == "none" else request.tools,
            template_kwargs=dict(request.template_kwargs),
        )

    async def start_chat(self, request: ChatRequest, *, wait: float | None = None) -> ChatStream:
        """Validate, render, check the context and queue the request.

        Everything that can fail before the first token fails here (unknown
        model, template error, context overflow, queue full), so a server can
        answer with a proper status before it starts a stream.
        """
        if not request.messages:
            raise InvalidRequestError("messages must not be empty", param="messages")
        _check_tool_choice(request)
        # The lease keeps the model loaded until the request is queued; from then
        # on the engine's work keeps the pool from unloading it.
        with _text_model(await self.lease(request.model)) as loaded:
            return await self._start_chat(loaded, request, wait)

    async def _start_chat(
        self, loaded: LoadedModel, request: ChatRequest, wait: float | None
    ) -> ChatStream:
        options = self.render_options(request)
        messages: Sequence[ChatMessage] = request.messages
        if loaded.config.system_prompt_cache:
            messages = loaded.with_cached_system(messages)
        prompt_text = loaded.template.render(messages, options)
        prompt = loaded.tokenize_prompt(prompt_text)
        dropped = 0
        if loaded.config.context_overflow is ContextOverflow.trim:
            messages, trimmed = self._trim_to_fit(loaded, messages, options, request, len(prompt))
            if trimmed is not None:
                dropped, prompt = len(prompt) - len(trimmed), trimmed
        system_tokens = 0
        if loaded.config.system_prompt_cache:
            system_tokens = loaded.system_tokens(messages, options, prompt)
        sampling = resolve_sampling(request.sampling, loaded.config.sampling)
        if request.grammar or request.json_schema:
            sampling = replace(sampling, grammar=request.grammar, json_schema=request.json_schema)
        elif _forces_call(request):
            # A named function is one call; "required" may make several when allowed.
            several = request.parallel_tool_calls and request.tool_choice.mode == "required"
            constraint = loaded.template.tool_constraint(
                request.tools, request.tool_choice, several
            )
            if isinstance(constraint, str):
                sampling = replace(sampling, grammar=constraint)
            else:
                sampling = replace(sampling, structured=constraint)
        max_tokens = self._max_tokens(loaded, request, len(prompt))
        generation = GenerationRequest(
            prompt_tokens=tuple(prompt),
            sampling=sampling,
            max_tokens=max_tokens,
            stop=request.stop,
            logprobs=request.logprobs or request.top_logprobs > 0,
            top_logprobs=request.top_logprobs,
            system_tokens=system_tokens,
            special_tokens_as_text=loaded.template.special_tokens_as_text,
        )
        parser = loaded.template.parser(options, prompt_text)
        stream = await loaded.engine.submit(
            generation, wait=self.config.queue_wait_seconds if wait is None else wait
        )
        return ChatStream(
            loaded, stream, parser, len(prompt), dropped, request.parallel_tool_calls
        )

    def _trim_to_fit(
        self,
        loaded: LoadedModel,
        messages: Sequence[ChatMessage],
        options: RenderOptions,
        request: ChatRequest,
        prompt_len: int,
    ) -> tuple[Sequence[ChatMessage], list[int] | None]:
        """context_overflow: trim — drop the oldest non-system messages until the request fits.

        Returns the kept messages and their prompt, or (messages, None) when
        nothing had to go. The last message is never dropped.
        """
        wanted = request.max_tokens or 1
        limit = loaded.model.info.n_ctx_per_seq
        if prompt_len + wanted <= limit:
            return messages, None
        kept = list(messages)
        head = 1 if kept[0].role in ("system", "developer") else 0
        prompt: list[int] | None = None
        while len(kept) - head > 1:
            del kept[head]
            prompt = loaded.render(kept, options)
            if len(prompt) + wanted <= limit:
                return kept, prompt
        return kept, prompt

    def _max_tokens(self, loaded: LoadedModel, request: ChatRequest, prompt_len: int) -> int:
        """The request's max_tokens must fit; a default (model config or 4096) is capped."""
        limit = loaded.model.info.n_ctx_per_seq
        explicit = request.max_tokens
        room = limit - prompt_len
        if room < 1 or (explicit is not None and explicit > room):
            wanted = explicit or 1
            raise ContextOverflowError(
                f"this request needs {prompt_len + wanted} tokens ({prompt_len} in the prompt "
                f"+ {wanted} to generate) but the context window of {loaded.id} is {limit} tokens",
                param="messages",
            )
        if explicit is not None:
            return explicit
        return min(loaded.config.sampling.max_tokens or DEFAULT_MAX_TOKENS, room)

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

    def chat_request(
        self,
        messages: Sequence[ChatMessage | Mapping[str, Any]],
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        stop: str | Sequence[str] = (),
        logprobs: bool = False,
        top_logprobs: int = 0,
        grammar: str | None = None,
        json_schema: str | None = None,
        enable_thinking: bool | None = None,
        reasoning_effort: str | None = None,
        chat_template_kwargs: Mapping[str, str | int | float | bool | None] | None = None,
        tools: Sequence[ToolSpec] = (),
        tool_choice: ToolChoice | str = "auto",
        parallel_tool_calls: bool = True,
        **sampling: Any,
    ) -> ChatRequest:
        """Build a ChatRequest from keyword arguments; sampling keys as in the manual.

        `tool_choice` is "auto", "none", "required" or the name of one of `tools`.
        """
        try:
            overrides = SamplingConfig.model_validate(sampling)
        except ValidationError as exc:
            first = exc.errors()[0]
            key = ".".join(str(part) for part in first["loc"])
            raise InvalidRequestError(f"{key}: {first['msg']}", param=key) from None
        if max_tokens is not None and max_tokens < 1:
            raise InvalidRequestError("max_tokens must be at least 1", param="max_tokens")
        if not 0 <= top_logprobs <= 5:
            raise InvalidRequestError("top_logprobs must be between 0 and 5", param="top_logprobs")
        return ChatRequest(
            messages=tuple(_message(message) for message in messages),
            model=model,
            sampling=overrides,
            max_tokens=max_tokens,
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            grammar=grammar,
            json_schema=json_schema,
            enable_thinking=enable_thinking,
            reasoning_effort=reasoning_effort,
            template_kwargs=tuple((chat_template_kwargs or {}).items()),
            tools=tuple(tools),
            tool_choice=_tool_choice(tool_choice),
            parallel_tool_calls=parallel_tool_calls,
        )

    async def count_prompt_tokens(
        self, request: ChatRequest, *, add_generation_prompt: bool
    ) -> int:
        with _text_model(await self.lease(request.model)) as loaded:
            options = self.render_options(request, add_generation_prompt=add_generation_prompt)
            messages: Sequence[ChatMessage] = request.messages
            if loaded.config.system_prompt_cache:
                # Count what start_chat would run: with the remembered system prompt.
                messages = loaded.with_cached_system(messages, remember=False)
            return len(loaded.render(messages, options))

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
        inputs = _embedding_inputs(input)
        with _embedding_model(await self.lease(model)) as loaded:
            return await asyncio.to_thread(
                loaded.embed, inputs, dimensions=dimensions, truncate=truncate
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
        with _embedding_model(await self.lease(model)) as loaded:
            return await asyncio.to_thread(loaded.rerank, query, documents, top_n=top_n)

    def _request_finished(self, record: RequestRecord) -> None:
        try:
            self.hook.kronk_request_finished(record=record)
        except Exception:
            log.exception("a kronk_request_finished hook failed")


def _tool_choice(value: ToolChoice | str) -> ToolChoice:
    if isinstance(value, ToolChoice):
        return value
    if value in ("auto", "none", "required"):
        return ToolChoice(value)  # type: ignore[arg-type]
    return ToolChoice("function", value)


def _forces_call(request: ChatRequest) -> bool:
    return request.tool_choice.mode in ("required", "function")


def _check_tool_choice(request: ChatRequest) -> None:
    choice = request.tool_choice
    if not _forces_call(request):
        return
    if not request.tools:
        raise InvalidRequestError(
            f"tool_choice {choice.mode!r} needs at least one tool in tools", param="tool_choice"
        )
    if choice.mode == "function" and choice.name not in {tool.name for tool in request.tools}:
        raise InvalidRequestError(
            f"tool_choice names {choice.name!r}, which is not among the tools",
            param="tool_choice",
        )
    if request.grammar or request.json_schema:
        raise InvalidRequestError(
            "a forced tool call cannot be combined with a grammar or a JSON schema output",
            param="tool_choice",
        )


PooledModel = LoadedModel | LoadedEmbeddingModel


def _release_if_leased(future: asyncio.Future[Lease[PooledModel]]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().release()


def _text_model(lease: Lease[PooledModel]) -> Lease[LoadedModel]:
    """The lease, if its model can chat; else release it and raise CapabilityError."""
    if isinstance(lease.model, LoadedModel):
        return lease  # type: ignore[return-value]
    lease.release()
    raise CapabilityError(
        f"{describe_capabilities(lease.model.id, lease.model.info)}, not chat", param="model"
    )


def _embedding_model(lease: Lease[PooledModel]) -> Lease[LoadedEmbeddingModel]:
    """The lease, if its model is an embedding model; else release it and raise CapabilityError."""
    if isinstance(lease.model, LoadedEmbeddingModel):
        return lease  # type: ignore[return-value]
    lease.release()
    raise CapabilityError(
        f"{describe_capabilities(lease.model.id, lease.model.info)}; it is not an embedding "
        "or reranking model",
        param="model",
    )


def _embedding_inputs(value: EmbeddingInput | Sequence[EmbeddingInput]) -> list[EmbeddingInput]:
    """One text, one token list, or a list of either → the list of inputs."""
    if isinstance(value, str):
        return [value]
    items = list(value)
    if not items:
        raise InvalidRequestError("input must not be empty", param="input")
    if all(isinstance(item, int) for item in items):
        return [items]  # type: ignore[list-item]
    if all(isinstance(item, str | Sequence) for item in items):
        return items  # type: ignore[return-value]
    raise InvalidRequestError(
        "input must be a string, a list of strings, or token ids", param="input"
    )



async def collect(stream: ChatStream) -> ChatResult:
    """Drain a ChatStream into a ChatResult."""
    content: list[str] = []
    reasoning: list[str] = []
    tool_calls: list[ToolCall] = []
    logprobs: list[TokenLogprob] = []
    finish = FinishReason.stop
    usage = Usage()
    stop_sequence = None
    async for delta in stream:
        content.append(delta.content)
        reasoning.append(delta.reasoning)
        tool_calls.extend(delta.tool_calls)
        logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            finish = delta.finish_reason
        if delta.usage is not None:
            usage = delta.usage
            stop_sequence = delta.stop_sequence
    return ChatResult(
        content="".join(content),
        reasoning="".join(reasoning),
        finish_reason=finish,
        usage=usage,
        tool_calls=tool_calls,
        logprobs=logprobs,
        stop_sequence=stop_sequence,
    )


__all__ = ["DEFAULT_MODEL_ID", "ChatStream", "Kronk", "LoadedModel", "PooledModel", "collect"]
