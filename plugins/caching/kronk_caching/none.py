"""The "none" strategy: every request starts from an empty sequence."""

from __future__ import annotations

from collections.abc import Sequence

from kronk_core.contract import (
    CacheCounters,
    CachePlan,
    ChatMessage,
    GenerationRequest,
    PromptScope,
    Slot,
    StrategyModel,
    TextModel,
)


class PromptsAsGiven:
    """The prompt side of a strategy that adds nothing to prompts."""

    needs_system_tokens = False

    def prompt_messages(
        self, messages: Sequence[ChatMessage], scope: PromptScope
    ) -> Sequence[ChatMessage]:
        return messages


class NoCache(PromptsAsGiven):
    name = "none"

    def select_slot(
        self, free: Sequence[Slot], request: GenerationRequest, model: StrategyModel
    ) -> Slot:
        return min(free, key=lambda slot: slot.last_used)

    def admit_later(
        self, request: GenerationRequest, prefilling: Sequence[tuple[Slot, Sequence[int]]]
    ) -> bool:
        return False

    def prepare(
        self, slot: Slot, request: GenerationRequest, model: StrategyModel, slots: Sequence[Slot]
    ) -> CachePlan:
        clear(slot, model)
        return CachePlan(reused=0)

    def prefilled(self, slot: Slot, model: StrategyModel) -> None:
        pass

    def evict(self, slot: Slot, model: StrategyModel) -> None:
        clear(slot, model)

    def release(self, slot: Slot, model: StrategyModel) -> None:
        clear(slot, model)

    def counters(self) -> CacheCounters:
        return CacheCounters()


def clear(slot: Slot, model: TextModel) -> None:
    model.seq_remove(slot.seq_id, 0, -1)
    slot.tokens.clear()
