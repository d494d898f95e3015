"""The "none" strategy: every request starts from an empty sequence."""

from __future__ import annotations

from collections.abc import Sequence

from kronk_core.backend import TextModel
from kronk_core.slots import Slot


class NoCache:
    name = "none"

    def select_slot(self, free: Sequence[Slot], prompt: Sequence[int]) -> Slot:
        return min(free, key=lambda slot: slot.last_used)

    def prepare(self, slot: Slot, prompt: Sequence[int], model: TextModel) -> int:
        clear(slot, model)
        return 0

    def release(self, slot: Slot, model: TextModel) -> None:
        clear(slot, model)


def clear(slot: Slot, model: TextModel) -> None:
    model.seq_remove(slot.seq_id, 0, -1)
    slot.tokens.clear()
