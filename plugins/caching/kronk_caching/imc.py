"""Incremental Message Cache: each slot keeps its conversation's KV between requests.

The slot's token record (prompt + generated tokens actually decoded) is the
truth; a request is routed to the slot whose tokens share the longest prefix
with the new prompt and only the rest is prefilled. Comparing tokens, never
message text, keeps the cache right when a re-rendered assistant turn differs
from what was generated (thinking stripped, whitespace, channel markup).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kronk_caching.counting import Counted
from kronk_caching.host_store import HostStore
from kronk_caching.none import PromptsAsGiven, clear
from kronk_caching.prefix import common_prefix
from kronk_core.backend import TextModel
from kronk_core.slots import CachePlan, Slot
from kronk_core.types import GenerationRequest

log = logging.getLogger(__name__)


class IncrementalCache(Counted, PromptsAsGiven):
    name = "imc"

    def __init__(self, *, min_tokens: int, trimmable: bool, store: HostStore | None) -> None:
        self._min_tokens = max(1, min_tokens)
        # When the KV cannot be cut at any position (SWA without swa_full, recurrent
        # state), a slot is reusable only when its whole content prefixes the prompt.
        self._trimmable = trimmable
        self.store = store

    def _usable(self, slot: Slot, prompt: Sequence[int]) -> int:
        shared = common_prefix(slot.tokens, prompt)
        if not self._trimmable and shared < len(slot.tokens):
            return 0
        shared = min(shared, len(prompt) - 1)
        return shared if shared >= self._min_tokens else 0

    def select_slot(self, free: Sequence[Slot], request: GenerationRequest) -> Slot:
        prompt = request.prompt_tokens
        best = max(free, key=lambda slot: (self._usable(slot, prompt), -slot.id))
        if self._usable(best, prompt):
            return best
        empty = [slot for slot in free if not slot.tokens]
        if empty:
            return empty[0]
        return min(free, key=lambda slot: slot.last_used)

    def prepare(self, slot: Slot, request: GenerationRequest, model: TextModel) -> CachePlan:
        prompt = request.prompt_tokens
        usable = self._usable(slot, prompt)
        if not usable and slot.tokens:
            self._evict(slot, model)
        restored = self._restore(slot, prompt, usable, model)
        if restored:
            usable = restored
        if not usable:
            clear(slot, model)
            self._count(rebuilds=1)
            return CachePlan(reused=0)
        if usable < len(slot.tokens):
            if not model.seq_remove(slot.seq_id, usable, -1):
                log.warning("slot %d: KV cannot be trimmed at %d; rebuilding", slot.id, usable)
                clear(slot, model)
                self._count(rebuilds=1)
                return CachePlan(reused=0)
            was = len(slot.tokens)
            del slot.tokens[usable:]
            # Dropping only the previous answer's tail (or re-prefilling the last
            # prompt token of an identical repeat) still counts as a hit.
            partial = not restored and usable < min(was, len(prompt) - 1)
            self._count(partial_hits=int(partial), hits=int(not partial and not restored))
        elif not restored:
            self._count(hits=1)
        self._count(tokens_saved=usable)
        return CachePlan(reused=usable)

    def _evict(self, slot: Slot, model: TextModel) -> None:
        self._count(evictions=1)
        if self.store is not None and len(slot.tokens) >= self._min_tokens:
            self.store.put(slot.tokens, model.seq_state(slot.seq_id))
        clear(slot, model)

    def _restore(self, slot: Slot, prompt: Sequence[int], usable: int, model: TextModel) -> int:
        """Load a stored conversation that beats the slot's own prefix; return the usable prefix."""
        if self.store is None:
            return 0
        shared, entry = self.store.best(prompt, at_least=max(usable + 1, self._min_tokens))
        if not shared or (not self._trimmable and shared < len(entry.tokens)):
            return 0
        state = self.store.state_of(entry)
        if slot.tokens:
            self._evict(slot, model)
        if state is None or model.set_seq_state(slot.seq_id, state) == 0:
            log.warning("slot %d: host cache restore failed; rebuilding", slot.id)
            clear(slot, model)
            return 0
        slot.tokens.extend(entry.tokens)
        self._count(restores=1)
        return min(shared, len(prompt) - 1)

    def release(self, slot: Slot, model: TextModel) -> None:
        """Keep the conversation: slot.tokens already lists exactly what is in the KV."""
