"""The "extend-only" cache strategy: a slot is reused only by a prompt that extends it all.

It never cuts a sequence back, so it is exact on every model, including
those whose KV cannot be trimmed (sliding-window attention without
swa_full, recurrent state): what it cannot extend it clears.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kronk_core.contract import (
    CacheCounters,
    CachePlan,
    ChatMessage,
    GenerationRequest,
    PromptScope,
    Slot,
    TextModel,
)


class ExtendOnly:
    name = "extend-only"
    needs_system_tokens = False

    def __init__(self, *, min_tokens: int) -> None:
        self._min_tokens = min_tokens
        self._counters = CacheCounters()

    def prompt_messages(
        self, messages: Sequence[ChatMessage], scope: PromptScope
    ) -> Sequence[ChatMessage]:
        return messages

    def _extends(self, slot: Slot, prompt: Sequence[int]) -> bool:
        held = len(slot.tokens)
        # At least the last prompt token must be left to prefill: the engine needs its logits.
        return self._min_tokens <= held < len(prompt) and list(prompt[:held]) == slot.tokens

    def select_slot(
        self, free: Sequence[Slot], request: GenerationRequest, model: TextModel
    ) -> Slot:
        extending = [slot for slot in free if self._extends(slot, request.prompt_tokens)]
        if extending:
            return max(extending, key=lambda slot: len(slot.tokens))
        # An empty slot first, else the least recently used.
        return min(free, key=lambda slot: (bool(slot.tokens), slot.last_used))

    def admit_later(
        self, request: GenerationRequest, prefilling: Sequence[tuple[Slot, Sequence[int]]]
    ) -> bool:
        return False  # it never copies prefixes between slots

    def prepare(
        self, slot: Slot, request: GenerationRequest, model: TextModel, slots: Sequence[Slot]
    ) -> CachePlan:
        if self._extends(slot, request.prompt_tokens):
            held = len(slot.tokens)
            self._counters = replace(
                self._counters,
                hits=self._counters.hits + 1,
                tokens_saved=self._counters.tokens_saved + held,
            )
            return CachePlan(reused=held)
        evicted = int(bool(slot.tokens))
        model.seq_remove(slot.seq_id, 0, -1)
        slot.tokens.clear()
        self._counters = replace(
            self._counters,
            rebuilds=self._counters.rebuilds + 1,
            evictions=self._counters.evictions + evicted,
        )
        return CachePlan(reused=0)

    def prefilled(self, slot: Slot, model: TextModel) -> None:
        pass

    def evict(self, slot: Slot, model: TextModel) -> None:
        model.seq_remove(slot.seq_id, 0, -1)
        slot.tokens.clear()
        self._counters = replace(self._counters, evictions=self._counters.evictions + 1)

    def release(self, slot: Slot, model: TextModel) -> None:
        """Keep the conversation: slot.tokens lists exactly what is in the KV."""

    def counters(self) -> CacheCounters:
        return self._counters
