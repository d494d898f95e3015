"""Draft strategies: what proposes tokens for speculative decoding, and what it is told.

A draft strategy guesses the next few tokens of a slot; the engine puts them
into the same decode as the slot's pending token, and the target model's own
sampling decides how many of them stand (kronk_core/runtime/speculation.py). A wrong
guess costs time, never a wrong token.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kronk_core.contract.backend import ModelInfo, StrategyModel
from kronk_core.contract.registry import RegistryKind
from kronk_core.contract.types import SamplingParams, TokenDistribution

if TYPE_CHECKING:
    from kronk_core.settings.config import ModelConfig


@dataclass(frozen=True, slots=True)
class DraftRequest:
    """One slot asking for a draft in this step.

    `context` is every token of the slot's sequence: what its KV holds, then
    the token the engine decodes now (the draft continues after it).
    """

    slot_id: int
    context: Sequence[int]
    max_tokens: int
    sampling: SamplingParams
    # Draw stochastic proposals from this (seeded from the request's seed).
    random: random.Random


@dataclass(frozen=True, slots=True)
class Draft:
    """Proposed tokens, at most the request's `max_tokens` (none: nothing to propose).

    `distributions`, when given, holds for each token the distribution it was
    drawn from: the engine then accepts it with probability min(1, p/q).
    Without them the tokens count as chosen deterministically.
    """

    tokens: tuple[int, ...] = ()
    distributions: tuple[TokenDistribution, ...] = ()


class DraftStrategy(Protocol):
    """Proposes draft tokens for the slots of one model; runs on its engine thread only."""

    name: str
    # The most tokens it proposes per step (its `ndraft`); the engine asks for fewer
    # when speculation does not pay, unless `adaptive` is false (for measuring a strategy).
    ndraft: int
    adaptive: bool
    # Whether a slot's proposals follow from its context (and the request's `random`) alone,
    # never from other requests, timing or a cache of its own, and cost next to nothing
    # beside a decode. Then a seeded or greedy request that has the model to itself drafts by
    # a rule of its own and decodes the same batches again: its answer is reproducible.
    reproducible: bool

    def propose(self, requests: Sequence[DraftRequest]) -> Sequence[Draft]:
        """One draft per request, in order. All speculating slots of a step come at once."""

    def close(self) -> None:
        """Free what the strategy holds (a draft model). Called once, when the engine stops."""


class DraftStrategyFactory(Protocol):
    """What `kronk_register_draft_strategies` registers: one strategy per model load."""

    def __call__(
        self, *, model_config: ModelConfig, model_info: ModelInfo, model: StrategyModel
    ) -> DraftStrategy: ...


DRAFT_STRATEGIES: RegistryKind[DraftStrategyFactory] = RegistryKind("draft_strategies")
