"""Incremental Message Cache: each slot keeps its conversation's KV between requests.

The slot's token record (prompt + generated tokens actually decoded) is the
truth; a request is routed to the slot whose tokens share the longest prefix
with the new prompt and only the rest is prefilled. Comparing tokens, never
message text, keeps the cache right when a re-rendered assistant turn differs
from what was generated (thinking stripped, whitespace, channel markup).

Where a new conversation shares a prefix with another slot's (sub-agents of
one tool: the same system prompt and tool list), that prefix is copied from
the other slot's sequence instead of prefilled again.

A KV that cannot be cut back at any position (sliding-window layers without
a full-size cache, recurrent state) is cut only down to its trim floor; for
cuts below it, the slot keeps checkpoints of its untrimmable part taken at
the end of each prompt.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kronk_caching.counting import Counted
from kronk_caching.host_store import Checkpoint, HostStore, StoredConversation, through
from kronk_caching.none import PromptsAsGiven, clear
from kronk_core.contract import (
    CacheCounters,
    CachePlan,
    GenerationRequest,
    Slot,
    StrategyModel,
    common_prefix,
    cut_point,
)

log = logging.getLogger(__name__)

# A conversation's first checkpoints are kept besides its latest ones: conversations that
# begin alike (sub-agents of one task, a retried or reopened first request) part there.
EARLIEST_CHECKPOINTS = 1


@dataclass(frozen=True, slots=True)
class Reuse:
    """How a prompt can reuse a sequence: keep `keep` tokens, via a checkpoint if given."""

    keep: int = 0
    checkpoint: Checkpoint | None = None


def _shared(tokens: Sequence[int], request: GenerationRequest) -> int:
    """How much of a sequence the prompt can keep: their common prefix, short of the last
    prompt token and of any media chunk it would end inside."""
    prompt = request.prompt_tokens
    return cut_point(request.media, min(common_prefix(tokens, prompt), len(prompt) - 1))


def _log_decision(slot: Slot, what: str, kept: int, prompt: int) -> None:
    """A debug line per slot compared, and one per plan (docs/caching.md, "Debug lines")."""
    share = 100 * kept // prompt if prompt else 0
    log.debug("slot[%d] %s %d/%d tokens (%d%% salvageable)", slot.id, what, kept, prompt, share)


class IncrementalCache(Counted, PromptsAsGiven):
    name = "imc"

    def __init__(
        self,
        *,
        min_tokens: int,
        trimmable: bool,
        store: HostStore | None,
        checkpoints: int = 4,
        write_through: bool = False,
        recurrent: bool = False,
    ) -> None:
        self._min_tokens = max(1, min_tokens)
        # Checkpoints are needed only where the KV cannot be cut at any position.
        self._max_checkpoints = 0 if trimmable else checkpoints
        # A recurrent state cannot be cut back to a shared prefix: never copied from a
        # slot that holds more than the prefix.
        self._recurrent = recurrent
        self._checkpoints: dict[int, list[Checkpoint]] = {}
        # Slot id → length of the last prompt prefilled in it (what followed was generated).
        self._prompt_end: dict[int, int] = {}
        self.store = store
        # Save each conversation after every request (a shared host_cache_dir), so another
        # server can continue it if this one dies.
        self._write_through = write_through

    def counters(self) -> CacheCounters:
        host_bytes = self.store.ram_bytes if self.store is not None else 0
        return replace(super().counters(), host_bytes=host_bytes)

    # ---- how much of a sequence a prompt can keep ----------------------------

    def _reuse(self, slot: Slot, request: GenerationRequest, model: StrategyModel) -> Reuse:
        shared = _shared(slot.tokens, request)
        if shared < self._min_tokens:
            return Reuse()
        if shared == len(slot.tokens) or shared >= model.trim_floor(slot.seq_id):
            return Reuse(shared)
        usable = [c for c in self._checkpoints.get(slot.id, ()) if c.floor <= shared]
        if not usable:
            return Reuse()
        best = max(usable, key=lambda c: min(c.length, shared))
        keep = min(best.length, shared)
        return Reuse(keep, best) if keep >= self._min_tokens else Reuse()

    def _donor(
        self, slots: Sequence[Slot], target: Slot, request: GenerationRequest, model: StrategyModel
    ) -> tuple[Slot | None, int]:
        """Another slot whose sequence starts with a longer prefix of the prompt."""
        best: tuple[Slot | None, int] = (None, 0)
        for other in slots:
            if other is target:
                continue
            shared = _shared(other.tokens, request)
            # The copied cells must include the whole window the next token attends to.
            if shared < len(other.tokens) and shared < model.trim_floor(other.seq_id):
                continue
            if shared > best[1]:
                best = (other, shared)
        return best

    def _continues(self, slot: Slot, prompt: Sequence[int], reuse: Reuse) -> bool:
        """Whether the prompt goes on with this slot's conversation.

        It does when it holds the slot's whole last prompt (at most the last
        answer is re-rendered differently); a prompt leaving earlier is another
        conversation, or an edit of this one, that shares a prefix.
        """
        end = self._prompt_end.get(slot.id, 0)
        return reuse.keep > 0 and common_prefix(slot.tokens, prompt) >= end

    # ---- CacheStrategy -------------------------------------------------------

    def select_slot(
        self, free: Sequence[Slot], request: GenerationRequest, model: StrategyModel
    ) -> Slot:
        """The slot whose conversation the prompt continues, else an empty one, else the LRU.

        A conversation that only shares a prefix keeps its slot: the prefix is
        copied (prepare), so sub-agents of one tool never evict each other.
        """
        prompt = request.prompt_tokens
        reuses = [(self._reuse(slot, request, model), slot) for slot in free]
        if log.isEnabledFor(logging.DEBUG):
            for kept, slot in reuses:
                if slot.tokens:
                    _log_decision(slot, "common-prefix", kept.keep, len(prompt))
        reuse, best = max(reuses, key=lambda pair: (pair[0].keep, -pair[1].id))
        if self._continues(best, prompt, reuse):
            return best
        empty = [slot for slot in free if not slot.tokens]
        if empty:
            return empty[0]
        return min(free, key=lambda slot: slot.last_used)

    def admit_later(
        self, request: GenerationRequest, prefilling: Sequence[tuple[Slot, Sequence[int]]]
    ) -> bool:
        """Hold a request whose prefix another slot is prefilling now: it copies it afterwards.

        Never on a recurrent model: the other slot's state cannot be cut back to the
        prefix, so waiting would only keep the two prompts from prefilling together.
        """
        if self._recurrent:
            return False
        prompt = request.prompt_tokens
        for slot, other in prefilling:
            shared = common_prefix(other, prompt)
            if shared >= self._min_tokens and len(slot.tokens) < min(shared, len(prompt) - 1):
                return True
        return False

    def prepare(
        self, slot: Slot, request: GenerationRequest, model: StrategyModel, slots: Sequence[Slot]
    ) -> CachePlan:
        """Reuse the slot's own prefix, another slot's (copied) or a stored one (restored).

        The cheapest wins unless a costlier one keeps at least cache_min_tokens more.
        """
        prompt = request.prompt_tokens
        reuse = self._reuse(slot, request, model)
        donor, shared = self._donor(slots, slot, request, model)
        stored, entry = self._stored(request, at_least=max(reuse.keep, shared) + self._min_tokens)
        if entry is not None:
            if slot.tokens:
                self._evict(slot, model)
            reuse = Reuse()
            restored = self._load(slot, entry, stored, model)
            if restored:
                through = int(restored < min(entry.floor, len(entry.tokens)))
                self._count(restores=1, checkpoint_restores=through, tokens_saved=restored)
                restore = "plan: restored from the host tier, keeps"
                _log_decision(slot, restore, restored, len(prompt))
                return CachePlan(reused=restored)
        if donor is not None and shared >= max(self._min_tokens, reuse.keep + self._min_tokens):
            _log_decision(slot, f"plan: copied from slot[{donor.id}], keeps", shared, len(prompt))
            return self._copy(donor, shared, slot, prompt, model)
        if reuse.keep and not self._continues(slot, prompt, reuse):
            # Another branch of the conversation is about to be cut away: keep it in
            # the host tier, whence it returns if the client goes back to it.
            self._save(slot, model)
        if not reuse.keep and slot.tokens:
            self._evict(slot, model)
        if not reuse.keep:
            self._clear(slot, model)
            self._count(rebuilds=1)
            _log_decision(slot, "plan: rebuilt, keeps", 0, len(prompt))
            return CachePlan(reused=0)
        keep = reuse.keep
        was = len(slot.tokens)
        if keep < was and not self._cut(slot, reuse, model):
            log.warning("slot %d: KV cannot be cut at %d; rebuilding", slot.id, keep)
            self._clear(slot, model)
            self._count(rebuilds=1)
            return CachePlan(reused=0)
        # Dropping only the previous answer's tail (or re-prefilling the last
        # prompt token of an identical repeat) still counts as a hit.
        partial = keep < min(was, len(prompt) - 1)
        how = f"cut back from {was}" if keep < was else "extended"
        if reuse.checkpoint is not None:
            how += f" through the checkpoint at {reuse.checkpoint.length}"
        _log_decision(slot, f"plan: {how}, keeps", keep, len(prompt))
        self._count(
            partial_hits=int(partial),
            hits=int(not partial),
            checkpoint_restores=int(reuse.checkpoint is not None),
            tokens_saved=keep,
        )
        return CachePlan(reused=keep)

    def prefilled(self, slot: Slot, model: StrategyModel) -> None:
        """The whole prompt is in the slot: remember where it ends, checkpoint if needed."""
        self._prompt_end[slot.id] = len(slot.tokens)
        if not self._max_checkpoints:
            return
        kept = self._checkpoints.setdefault(slot.id, [])
        state = model.checkpoint(slot.seq_id)
        kept.append(Checkpoint(len(slot.tokens), state, model.trim_floor(slot.seq_id)))
        if len(kept) > EARLIEST_CHECKPOINTS + self._max_checkpoints:
            del kept[EARLIEST_CHECKPOINTS]

    def evict(self, slot: Slot, model: StrategyModel) -> None:
        """To the host tier, whence a request under the slot's adapters restores it."""
        self._evict(slot, model)

    def release(self, slot: Slot, model: StrategyModel) -> None:
        """Keep the conversation: slot.tokens already lists exactly what is in the KV."""
        if self._write_through:
            self._save(slot, model)

    # ---- moving state ----------------------------------------------------------

    def _cut(self, slot: Slot, reuse: Reuse, model: StrategyModel) -> bool:
        keep = reuse.keep
        if reuse.checkpoint is not None:
            done = model.restore_checkpoint(slot.seq_id, keep, reuse.checkpoint.state)
        else:
            done = model.seq_remove(slot.seq_id, keep, -1)
        if done:
            del slot.tokens[keep:]
            self._drop_checkpoints_after(slot, keep)
            self._prompt_end[slot.id] = min(self._prompt_end.get(slot.id, 0), keep)
        return done

    def _copy(
        self, donor: Slot, shared: int, slot: Slot, prompt: Sequence[int], model: StrategyModel
    ) -> CachePlan:
        if slot.tokens:
            self._evict(slot, model)
        model.seq_copy(donor.seq_id, slot.seq_id, 0, shared)
        slot.tokens.extend(prompt[:shared])
        self._checkpoints[slot.id] = [
            c for c in self._checkpoints.get(donor.id, ()) if c.length <= shared
        ]
        self._count(shared_prefixes=1, tokens_saved=shared)
        return CachePlan(reused=shared)

    def _clear(self, slot: Slot, model: StrategyModel) -> None:
        clear(slot, model)
        self._checkpoints.pop(slot.id, None)
        self._prompt_end.pop(slot.id, None)

    def _drop_checkpoints_after(self, slot: Slot, length: int) -> None:
        kept = self._checkpoints.get(slot.id)
        if kept:
            kept[:] = [c for c in kept if c.length <= length]

    def _evict(self, slot: Slot, model: StrategyModel) -> None:
        self._count(evictions=1)
        self._save(slot, model)
        self._clear(slot, model)

    def _save(self, slot: Slot, model: StrategyModel) -> None:
        if self.store is not None and len(slot.tokens) >= self._min_tokens:
            floor = model.trim_floor(slot.seq_id)
            checkpoints = self._checkpoints.get(slot.id, ())
            state = model.seq_state(slot.seq_id)
            self.store.put(slot.tokens, state, floor, checkpoints, slot.adapters)

    def _stored(
        self, request: GenerationRequest, at_least: int
    ) -> tuple[int, StoredConversation | None]:
        """The host tier's conversation that keeps the most of this prompt, and how much."""
        if self.store is None:
            return 0, None
        prompt = request.prompt_tokens

        def usable(entry: StoredConversation, shared: int) -> int:
            keep = cut_point(request.media, min(shared, len(prompt) - 1))
            if keep >= min(entry.floor, len(entry.tokens)):
                return keep
            # Below the trim floor: as far as a checkpoint reaches.
            kept = through(entry.checkpoint_spans, keep)
            return kept if kept >= self._min_tokens else 0

        keep, entry = self.store.best(prompt, usable, request.adapters)
        return (keep, entry) if keep >= at_least else (0, None)

    def _load(self, slot: Slot, entry: StoredConversation, keep: int, model: StrategyModel) -> int:
        """Restore a stored conversation into the (empty) slot, cut to `keep` (through the
        checkpoint taken there when the trim floor is above it); 0 on failure."""
        assert self.store is not None
        state = self.store.state_of(entry)
        if state is None or model.set_seq_state(slot.seq_id, state) == 0:
            log.warning("slot %d: host cache restore failed; rebuilding", slot.id)
            self._clear(slot, model)
            return 0
        slot.tokens.extend(entry.tokens)
        # The slot can cut back through the conversation's checkpoints as it could before.
        self._checkpoints[slot.id] = list(self.store.checkpoints_of(entry))
        checkpoint = None
        if keep < min(entry.floor, len(entry.tokens)):
            checkpoint = next((c for c in self._checkpoints[slot.id] if c.reaches(keep)), None)
            if checkpoint is None:  # its file went missing
                self._clear(slot, model)
                return 0
        if keep < len(slot.tokens) and not self._cut(slot, Reuse(keep, checkpoint), model):
            self._clear(slot, model)
            return 0
        return keep
