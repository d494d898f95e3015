"""Slots as cache strategies see them, and the strategy protocol."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from kronk_core.contract.backend import ModelInfo, StrategyModel
from kronk_core.contract.generation import GenerationRequest
from kronk_core.contract.registry import RegistryKind
from kronk_core.contract.types import Adapters, ChatMessage

if TYPE_CHECKING:
    from kronk_core.settings.config import ModelConfig


@dataclass(slots=True)
class Slot:
    """One engine slot, bound 1:1 to a KV sequence.

    `tokens` is the truth about the cache: exactly the token ids whose KV is in
    sequence `seq_id`, in order, generated tokens included; `adapters` the LoRA adapters
    they were decoded under (the engine gives a strategy only slots whose adapters are the
    request's, or empty ones).
    """

    id: int
    seq_id: int
    tokens: list[int] = field(default_factory=list)
    busy: bool = False
    pending: bool = False
    last_used: float = 0.0
    adapters: Adapters = ()


@dataclass(frozen=True, slots=True)
class CachePlan:
    """What `prepare` did: `reused` prompt tokens are already in the slot's KV."""

    reused: int


@dataclass(frozen=True, slots=True)
class CacheCounters:
    hits: int = 0
    partial_hits: int = 0
    rebuilds: int = 0
    evictions: int = 0
    restores: int = 0
    # Cut back below the trim floor by restoring a checkpoint (sliding window, recurrent).
    checkpoint_restores: int = 0
    # Prompt prefixes copied from another slot's sequence instead of prefilled.
    shared_prefixes: int = 0
    tokens_saved: int = 0
    # Bytes of KV state the strategy holds in host memory (a gauge, not a total).
    host_bytes: int = 0


@dataclass(frozen=True, slots=True)
class PromptScope:
    """What a cache strategy is told about a request before its prompt is rendered.

    `remember` is false when the prompt is only counted (count_tokens,
    tokenize): the strategy must not learn from it. `subject` is who is
    asking: the token's subject when the server authenticates, None when it
    does not (every caller is then one user). What a strategy learns from one
    subject's requests must not change another subject's prompts.
    """

    remember: bool = True
    subject: str | None = None


class CacheStrategy(Protocol):
    """Decides which slot a prompt runs in and how much of its KV is reused.

    `prompt_messages` runs in the request's worker thread (several at once), before
    the prompt is rendered; everything else runs only on the engine thread, so slot
    state needs no locking. Lock the state `prompt_messages` keeps, and keep it apart
    from the engine side's or lock what they share.
    """

    name: str
    # Whether requests must carry GenerationRequest.system_tokens (the length of the
    # system prompt in the prompt): finding it costs two extra renders per request.
    needs_system_tokens: bool

    def prompt_messages(
        self, messages: Sequence[ChatMessage], scope: PromptScope
    ) -> Sequence[ChatMessage]:
        """The messages to render for this request: `messages` unless the strategy adds to it.

        SPC, for one, adds the system prompt it remembers to a request that has none.
        """

    def select_slot(
        self, free: Sequence[Slot], request: GenerationRequest, model: StrategyModel
    ) -> Slot:
        """Pick one of the free slots (never empty) for this request."""

    def admit_later(
        self, request: GenerationRequest, prefilling: Sequence[tuple[Slot, Sequence[int]]]
    ) -> bool:
        """True to leave a queued request waiting while other slots prefill.

        `prefilling` pairs each slot now prefilling with its whole prompt. A
        strategy that can copy prompt prefixes between slots holds a request
        whose prefix one of them is about to hold; the engine asks again after
        every step and never holds a request while no slot prefills. While one is
        held, the prefilling slots' chunks stop where their prompts part from its.
        """

    def prepare(
        self, slot: Slot, request: GenerationRequest, model: StrategyModel, slots: Sequence[Slot]
    ) -> CachePlan:
        """Make the slot's sequence hold a prefix of the prompt; say how long it is.

        On return `slot.tokens` must equal `prompt[:plan.reused]`, and at least
        the last prompt token must be left to prefill (the engine needs its
        logits). `slots` are all of the engine's slots, busy ones included:
        their sequences may be read (`TextModel.seq_copy` from them), never
        changed.
        """

    def prefilled(self, slot: Slot, model: StrategyModel) -> None:
        """The whole prompt is in the slot and its first token was sampled, not yet decoded."""

    def evict(self, slot: Slot, model: StrategyModel) -> None:
        """Empty this free slot: the engine gives it to a request its KV cannot serve (one
        under other LoRA adapters). Keep what is worth keeping first, as at any eviction; on
        return `slot.tokens` is empty."""

    def release(self, slot: Slot, model: StrategyModel) -> None:
        """The request in this slot finished; keep or drop its KV."""

    def counters(self) -> CacheCounters:
        """Totals since the model loaded (hits, partial hits, rebuilds, ...)."""


class CacheStrategyFactory(Protocol):
    """What `kronk_register_cache_strategies` registers: one strategy per model load."""

    def __call__(self, *, model_config: ModelConfig, model_info: ModelInfo) -> CacheStrategy: ...


CACHE_STRATEGIES: RegistryKind[CacheStrategyFactory] = RegistryKind("cache_strategies")
