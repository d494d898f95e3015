"""Model loading and wiring: a model's settings into a backend model, engine and template."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any

from kronk_core.contract.backend import (
    MediaModel,
    ModelInfo,
    ShiftableModel,
    StrategyModel,
    TextModel,
)
from kronk_core.contract.cache import CACHE_STRATEGIES, CacheStrategy
from kronk_core.contract.drafts import DRAFT_STRATEGIES, DraftStrategy
from kronk_core.contract.errors import (
    CapabilityError,
    ConfigError,
    InvalidRequestError,
    ModelLoadError,
    TemplateError,
)
from kronk_core.contract.kronk_view import KronkView, PluginManager
from kronk_core.contract.media import MEDIA_MARKER, Media, MediaPrompt
from kronk_core.contract.records import RequestRecord
from kronk_core.contract.sampling import SamplerStage
from kronk_core.contract.templates import TEMPLATE_PROCESSORS, RenderOptions, TemplateProcessor
from kronk_core.contract.types import Adapters, ChatMessage, SamplingParams
from kronk_core.runtime.embeddings import LoadedEmbeddingModel, describe_capabilities
from kronk_core.runtime.engine import Engine
from kronk_core.runtime.pool import Lease
from kronk_core.settings.config import ModelConfig
from kronk_core.settings.model_files import (
    backend_for,
    model_sources,
    provided_models,
    resolve_model_config,
    resolve_reference,
)
from kronk_core.settings.sections import ModelSection, bind, declared_sections

log = logging.getLogger(__name__)


@dataclass(eq=False)
class LoadedModel:
    """A model with its engine, cache strategy and template processor, ready for requests."""

    config: ModelConfig
    model: TextModel
    engine: Engine
    template: TemplateProcessor
    cache: CacheStrategy
    # The LoRA adapters' scales requests get unless they ask for others, by adapter id: the
    # model config's until `set_lora_scales`.
    lora_scales: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        self.lora_scales = tuple(adapter.scale for adapter in self.model.info.adapters)

    @property
    def id(self) -> str:
        return self.config.id

    def set_lora_scales(self, scales: Adapters) -> None:
        """Scales for later requests, as llama-server's POST /lora-adapters: the adapters
        listed get theirs, the others 0."""
        given = dict(self._checked(scales))
        self.lora_scales = tuple(given.get(index, 0.0) for index in range(len(self.lora_scales)))

    def adapters_for(self, lora: Adapters | None) -> Adapters:
        """The adapters a request's decodes apply: its `lora` scales (adapters it leaves out:
        0) or the current ones, the non-zero ones by id."""
        if lora is None:
            scales: Adapters = tuple(enumerate(self.lora_scales))
        else:
            scales = self._checked(lora)
        return tuple((index, scale) for index, scale in sorted(scales) if scale != 0.0)

    def _checked(self, scales: Adapters) -> Adapters:
        count = len(self.lora_scales)
        ids = [index for index, _ in scales]
        for index in ids:
            if not 0 <= index < count:
                have = f"ids 0-{count - 1}" if count else "none"
                raise InvalidRequestError(
                    f"lora: {self.id} has no adapter {index} (its LoRA adapters: {have})",
                    param="lora",
                )
        if len(set(ids)) < len(ids):
            raise InvalidRequestError("lora: an adapter is listed twice", param="lora")
        return scales

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

    @cached_property
    def end_tokens(self) -> frozenset[int]:
        """The template's turn opener as a token, where it is one control token (it reads
        as several tokens when taken as plain text)."""
        opener = self.template.turn_opener
        if not opener:
            return frozenset()
        tokens = self.tokenize_prompt(opener)
        plain = self.model.tokenize(opener, add_special=False, parse_special=False)
        return frozenset(tokens) if len(tokens) == 1 and plain != tokens else frozenset()

    def prompt(self, text: str, media: Sequence[Media] = ()) -> MediaPrompt:
        """A rendered prompt's tokens; its MEDIA_MARKERs are `media`, in order, read through
        the model's projector (CapabilityError if it has none, or none for their kind)."""
        if not media:
            return MediaPrompt(tuple(self.tokenize_prompt(text)))
        model = self.model
        if not isinstance(model, MediaModel) or not model.info.media:
            raise CapabilityError(
                f"{self.id} has no projector: it does not read images or sounds "
                "(see docs/vision.md)",
                param="messages",
            )
        for kind in {item.kind for item in media} - model.info.media:
            raise CapabilityError(
                f"the projector of {self.id} reads "
                + " and ".join(sorted(k.capability for k in model.info.media))
                + f" input, not {kind.capability}",
                param="messages",
            )
        pieces = text.split(MEDIA_MARKER)
        if len(pieces) != len(media) + 1:
            raise TemplateError(
                f"the chat template of {self.id} rendered {len(pieces) - 1} of the "
                f"request's {len(media)} images and sounds"
            )
        parts: list[str | Media] = [pieces[0]]
        for item, piece in zip(media, pieces[1:], strict=True):
            parts += [item, piece]
        return model.tokenize_media(parts)

    def close(self) -> None:
        self.engine.close()
        self.model.close()


PooledModel = LoadedModel | LoadedEmbeddingModel


def model_sections(manager: PluginManager) -> list[ModelSection[Any]]:
    """The sections of a model's entry that the active plugins declare."""
    declared = declared_sections(manager, ModelSection, set(ModelConfig.model_fields))
    return [section for _, section in declared.values()]


def bind_model_settings(kronk: KronkView, config: ModelConfig) -> ModelConfig:
    """`config` with every plugin section validated (ConfigError naming the key)."""
    explicit = {key: getattr(config, key) for key in config.model_fields_set}
    bound = bind(config, kronk.model_sections, kronk.disabled_plugins, explicit)
    return config.model_copy(update={"sections": bound.sections, **bound.chosen})


def model_config_for(kronk: KronkView, model_id: str, *, pull: bool = False) -> ModelConfig:
    """The settings a load of `model_id` uses: resolved, with its plugin sections validated.

    An entry's `source` is resolved by the plugins, and pulled first with `pull` (a load);
    without, it must be on disk already.
    """
    entry = kronk.config.model(model_id)
    source_id = None
    if entry is not None and entry.source is not None and entry.model_path is None:
        source_id = resolve_reference(kronk, entry.source, pull=pull)
        if source_id is None:
            why = "no plugin can fetch it" if pull else "it is not pulled yet"
            raise ConfigError(entry.section_key("source"), f"{entry.source!r}: {why}")
    resolved = resolve_model_config(
        kronk.config,
        model_id,
        provided_models(kronk),
        model_sources(kronk),
        source_id,
        bind=partial(bind_model_settings, kronk),
    )
    return bind_model_settings(kronk, resolved).with_context_default(kronk.config.context_window)


def load_model(
    kronk: KronkView, model_id: str, on_finished: Callable[[RequestRecord], None]
) -> PooledModel:
    """Resolve, bind and load a model; a text model gets its engine, cache and template."""
    config = model_config_for(kronk, model_id, pull=True)
    backend_name, backend = backend_for(kronk, config)
    started = time.monotonic()
    model = backend.load_model(config)
    if not isinstance(model, TextModel):
        log.info(
            "loaded %s in %.2fs: backend=%s %s contexts=%d ctx=%d",
            model_id,
            time.monotonic() - started,
            backend_name,
            describe_capabilities(model_id, model.info),
            model.info.n_seq_max,
            model.info.n_ctx_per_seq,
        )
        return LoadedEmbeddingModel(config, model)
    info = model.info
    try:
        key = config.section_key
        if config.context_shift and not (isinstance(model, ShiftableModel) and info.kv_shiftable):
            why = (
                "its recurrent state"
                if info.recurrent
                else "its sliding-window attention"
                if info.n_swa
                else "its KV cache cannot move positions"
            )
            raise ConfigError(key("context_shift"), f"{config.id} cannot shift its context ({why})")
        cache_factory = kronk.registry(CACHE_STRATEGIES).get(config.cache, key("cache"))
        template_factory = kronk.registry(TEMPLATE_PROCESSORS).get(
            config.template_processor, key("template_processor")
        )
        cache: CacheStrategy = cache_factory(model_config=config, model_info=info)
        template: TemplateProcessor = template_factory(model_config=config, model_info=info)

        def stages(params: SamplingParams) -> list[SamplerStage]:
            return list(kronk.hook.kronk_sampler_stages(params=params, model_info=info) or [])

        if not stages(SamplingParams()):
            raise ModelLoadError("no plugin provides sampler stages")
        drafter = draft_strategy(kronk, config, model)
        try:
            engine = Engine(
                model,
                n_batch=config.n_batch,
                queue_depth=config.queue_depth,
                cache=cache,
                sampler_stages=stages,
                on_finished=on_finished,
                drafter=drafter,
            )
        except BaseException:
            if drafter is not None:
                drafter.close()
            raise
    except BaseException:
        model.close()
        raise
    log.info(
        "loaded %s in %.2fs: backend=%s template=%s cache=%s slots=%d ctx/slot=%d",
        model_id,
        time.monotonic() - started,
        backend_name,
        template.name,
        cache.name,
        info.n_seq_max,
        info.n_ctx_per_seq,
    )
    return LoadedModel(config=config, model=model, engine=engine, template=template, cache=cache)


def draft_strategy(
    kronk: KronkView, config: ModelConfig, model: StrategyModel
) -> DraftStrategy | None:
    """The model's draft strategy for speculative decoding: the one `draft_strategy` names,
    none for "none", and where it is unset the default one if this model can use it."""
    name, key = config.draft_strategy, config.section_key("draft_strategy")
    registry = kronk.registry(DRAFT_STRATEGIES)
    # A sliding window can be cut back near its end; a recurrent state not at all, even
    # where the model's attention layers have a window (a hybrid such as LFM2).
    info = model.info
    can_cut = not info.recurrent and (info.kv_trimmable or bool(info.n_swa))
    if name is None:
        if not can_cut or registry.default is None:
            return None
        name = registry.default
    elif name == "none":
        return None
    elif not can_cut:
        raise ConfigError(
            key,
            f"{config.id} keeps recurrent state that cannot be cut back, and speculative "
            "decoding must drop the draft tokens the model rejects",
        )
    factory = registry.get(name, key)
    drafter: DraftStrategy = factory(model_config=config, model_info=model.info, model=model)
    log.info("%s: speculative decoding with draft strategy %s", config.id, drafter.name)
    return drafter


def release_if_leased(future: asyncio.Future[Lease[PooledModel]]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().release()


def text_model(lease: Lease[PooledModel]) -> Lease[LoadedModel]:
    """The lease, if its model can chat; else release it and raise CapabilityError."""
    if isinstance(lease.model, LoadedModel):
        return lease  # type: ignore[return-value]
    lease.release()
    raise CapabilityError(
        f"{describe_capabilities(lease.model.id, lease.model.info)}, not chat", param="model"
    )


def embedding_model(lease: Lease[PooledModel]) -> Lease[LoadedEmbeddingModel]:
    """The lease, if its model is an embedding model; else release it and raise CapabilityError."""
    if isinstance(lease.model, LoadedEmbeddingModel):
        return lease  # type: ignore[return-value]
    lease.release()
    raise CapabilityError(
        f"{describe_capabilities(lease.model.id, lease.model.info)}; it is not an embedding "
        "or reranking model",
        param="model",
    )
