"""What the engine reports: each step's batch, a slot's state, and counters."""

from __future__ import annotations

from dataclasses import dataclass, field

from kronk_core.contract.types import Adapters


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one engine step put into its decode: slot id → token count.

    A generating slot decodes one token, plus its draft tokens when it speculates:
    `drafts` holds those, by slot id, in the order they follow the slot's token.
    """

    index: int
    generating: dict[int, int]
    prefilling: dict[int, int]
    drafts: dict[int, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SlotState:
    """A snapshot of one slot for reporting (SDK, admin endpoint)."""

    id: int
    cached_tokens: int
    idle_seconds: float
    busy: bool
    pending: bool
    # Speculative decoding: the draft tokens of the slot's current (or last) request that
    # became output and that did not, and the acceptance rate its drafting goes by.
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    draft_acceptance: float | None = None
    # The LoRA adapters its cached tokens were decoded under ((id, scale) pairs).
    adapters: Adapters = ()


@dataclass(frozen=True, slots=True)
class EngineStats:
    steps: int
    queued: int
    active: int
    generated_tokens: int
    prefilled_tokens: int
