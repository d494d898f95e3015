"""System Prompt Cache: the system prompt's KV, exported once, restored into any slot.

Instead of a scratch sequence, the first request with a new system prompt
pauses its own prefill exactly at the system prompt's end and exports that
state (`snapshot`), so building costs no extra decode and no reserved
sequence. Entries are keyed by the exact system-prompt tokens, LRU-bounded.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace

from kronk_caching.none import clear
from kronk_caching.prefix import token_key
from kronk_core.backend import TextModel
from kronk_core.slots import CacheCounters, CachePlan, Slot
from kronk_core.types import GenerationRequest

log = logging.getLogger(__name__)


class SystemPromptCache:
    name = "spc"

    def __init__(self, *, min_tokens: int, max_entries: int = 8) -> None:
        self._min_tokens = min_tokens
        self._max_entries = max_entries
        self._states: OrderedDict[bytes, bytes] = OrderedDict()
        self._pending: dict[int, bytes] = {}  # slot id → key being built
        self._counters = CacheCounters()

    def select_slot(self, free: Sequence[Slot], request: GenerationRequest) -> Slot:
        return min(free, key=lambda slot: slot.last_used)

    def prepare(self, slot: Slot, request: GenerationRequest, model: TextModel) -> CachePlan:
        clear(slot, model)
        size = request.system_tokens
        if size < self._min_tokens or size >= len(request.prompt_tokens):
            return CachePlan(reused=0)
        system = request.prompt_tokens[:size]
        key = token_key(system)
        state = self._states.get(key)
        if state is not None and model.set_seq_state(slot.seq_id, state) > 0:
            self._states.move_to_end(key)
            slot.tokens.extend(system)
            self._count(hits=1, tokens_saved=size)
            return CachePlan(reused=size)
        if state is not None:
            log.warning("SPC state restore failed on slot %d; rebuilding", slot.id)
            clear(slot, model)
            del self._states[key]
        self._pending[slot.id] = key
        self._count(rebuilds=1)
        return CachePlan(reused=0, snapshot_at=size)

    def snapshot(self, slot: Slot, model: TextModel) -> None:
        key = self._pending.pop(slot.id, None)
        if key is None:
            return
        self._states[key] = model.seq_state(slot.seq_id)
        self._states.move_to_end(key)
        while len(self._states) > self._max_entries:
            self._states.popitem(last=False)
            self._count(evictions=1)
        log.info(
            "SPC cached a %d-token system prompt (%d entries)", len(slot.tokens), len(self._states)
        )

    def release(self, slot: Slot, model: TextModel) -> None:
        self._pending.pop(slot.id, None)
        clear(slot, model)

    def counters(self) -> CacheCounters:
        return self._counters

    def _count(self, **deltas: int) -> None:
        current = self._counters
        self._counters = replace(
            current, **{name: getattr(current, name) + value for name, value in deltas.items()}
        )
