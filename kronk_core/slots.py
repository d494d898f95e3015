"""Slots as cache strategies see them, and the strategy protocol."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kronk_core.backend import TextModel


@dataclass(slots=True)
class Slot:
    """One engine slot, bound 1:1 to a KV sequence.

    `tokens` is the truth about the cache: exactly the token ids whose KV is in
    sequence `seq_id`, in order, generated tokens included.
    """

    id: int
    seq_id: int
    tokens: list[int] = field(default_factory=list)
    busy: bool = False
    pending: bool = False
    last_used: float = 0.0


class CacheStrategy(Protocol):
    """Decides which slot a prompt runs in and how much of its KV is reused.

    Called only from the engine thread, so implementations need no locking
    for slot state.
    """

    name: str

    def select_slot(self, free: Sequence[Slot], prompt: Sequence[int]) -> Slot:
        """Pick one of the free slots (never empty) for this prompt."""

    def prepare(self, slot: Slot, prompt: Sequence[int], model: TextModel) -> int:
        """Make the slot's sequence hold a prefix of `prompt`; return that prefix's length.

        On return `slot.tokens` must equal `prompt[:n]`, and at least the last
        prompt token must be left to prefill (the engine needs its logits).
        """

    def release(self, slot: Slot, model: TextModel) -> None:
        """The request in this slot finished; keep or drop its KV."""
