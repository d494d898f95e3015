"""System Prompt Cache: the system prompt's KV, exported once, restored into any slot.

No scratch sequence: the first request with a new system prompt prefills as
usual; when it finishes, its slot is trimmed back to the system prompt
(exact with a full-size SWA cache) and that state is exported to RAM. Later
requests restore it and prefill only the rest. Entries are keyed by the
exact system-prompt tokens and bounded (LRU).

Before rendering (in the request's worker thread), the strategy remembers the system
prompts it sees, and a request without one gets the only one remembered, by
default only the one its own caller sent (`spc_system_prompt_reuse`): with
authentication on, one tenant's instructions never run under another's request.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence

from kronk_caching.counting import Counted
from kronk_caching.none import NoCache, clear
from kronk_caching.prefix import token_key
from kronk_caching.settings import SystemPromptReuse
from kronk_core.contract import (
    CachePlan,
    ChatMessage,
    GenerationRequest,
    PromptScope,
    Slot,
    StrategyModel,
)

log = logging.getLogger(__name__)

# Callers whose system prompt is remembered, least recent out first (a forgotten caller's
# requests without a system prompt then run without one).
MAX_CALLERS = 1024


class SystemPromptCache(Counted, NoCache):
    """Slots are chosen as without a cache (least recently used); prepare and release differ."""

    name = "spc"
    needs_system_tokens = True

    def __init__(
        self,
        *,
        min_tokens: int,
        reuse: SystemPromptReuse = SystemPromptReuse.subject,
        max_entries: int = 8,
    ) -> None:
        self._min_tokens = min_tokens
        self._max_entries = max_entries
        self._reuse = reuse
        # Engine thread: states by system-prompt tokens, and what each slot exports at release.
        self._states: OrderedDict[bytes, bytes] = OrderedDict()
        self._to_export: dict[int, int] = {}
        # Requests' threads: per caller (None: all of them), the one system prompt it sent,
        # or None once it sent several; most recent caller last.
        self._known: OrderedDict[str | None, str | None] = OrderedDict()
        self._known_lock = threading.Lock()

    def prompt_messages(
        self, messages: Sequence[ChatMessage], scope: PromptScope
    ) -> Sequence[ChatMessage]:
        """Remember system prompts; prepend the caller's only one when a request has none."""
        if self._reuse is SystemPromptReuse.off:
            return messages
        caller = scope.subject if self._reuse is SystemPromptReuse.subject else None
        first = messages[0]
        if first.role in ("system", "developer") and first.media:
            return messages  # a system prompt with images is not text to hand to others
        if first.role in ("system", "developer") and first.content:
            if scope.remember:
                with self._known_lock:
                    seen = self._known.get(caller, first.content)
                    self._known[caller] = first.content if seen == first.content else None
                    self._known.move_to_end(caller)
                    while len(self._known) > MAX_CALLERS:
                        self._known.popitem(last=False)
            return messages
        with self._known_lock:
            known = self._known.get(caller)
        if known is None:
            return messages
        return [ChatMessage(role="system", content=known), *messages]

    def prepare(
        self, slot: Slot, request: GenerationRequest, model: StrategyModel, slots: Sequence[Slot]
    ) -> CachePlan:
        clear(slot, model)
        size = request.system_tokens
        if size < max(1, self._min_tokens) or size >= len(request.prompt_tokens):
            return CachePlan(reused=0)
        system = request.prompt_tokens[:size]
        key = token_key(system, request.adapters)
        state = self._states.get(key)
        if state is not None:
            if model.set_seq_state(slot.seq_id, state) > 0:
                self._states.move_to_end(key)
                slot.tokens.extend(system)
                self._count(hits=1, tokens_saved=size)
                return CachePlan(reused=size)
            log.warning("SPC restore failed on slot %d; rebuilding", slot.id)
            del self._states[key]
            clear(slot, model)
        self._to_export[slot.id] = size
        self._count(rebuilds=1)
        return CachePlan(reused=0)

    def release(self, slot: Slot, model: StrategyModel) -> None:
        size = self._to_export.pop(slot.id, 0)
        exact = size >= model.trim_floor(slot.seq_id)  # cutting there keeps the window whole
        if size and len(slot.tokens) >= size and exact and model.seq_remove(slot.seq_id, size, -1):
            del slot.tokens[size:]
            self._states[token_key(slot.tokens, slot.adapters)] = model.seq_state(slot.seq_id)
            while len(self._states) > self._max_entries:
                self._states.popitem(last=False)
                self._count(evictions=1)
            log.info("SPC cached a %d-token system prompt (%d entries)", size, len(self._states))
        clear(slot, model)
