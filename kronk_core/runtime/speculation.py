"""Speculative decoding on the engine side: which slots draft, and which draft tokens stand.

Each step the policy (kronk_core/runtime/draft_policy.py) decides how many tokens each
generating slot drafts, the model's draft strategy proposes them, and the
engine puts them into the step's decode behind the slot's pending token.
Afterwards the target's own sampler chain walks the rows: a draft token stands
only if the target would have produced it (`verify`), so the output is the
target's, token for token when greedy and in distribution when sampling.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kronk_core.contract.backend import Sampler, TextModel
from kronk_core.contract.cache import Slot
from kronk_core.contract.drafts import Draft, DraftRequest, DraftStrategy
from kronk_core.contract.types import SamplingParams, TokenDistribution
from kronk_core.runtime.draft_policy import DraftPolicy, Wish

log = logging.getLogger(__name__)

# Explicit target distributions are used only while this small (top-k keeps them so);
# larger ones are verified by sampling and comparing, which is exact too.
_SUPPORT_LIMIT = 512


def accept_or_correct(
    p: TokenDistribution, q: TokenDistribution | None, draft: int, rng: random.Random
) -> int:
    """Speculative sampling: the token to emit where the draft proposed `draft`, drawn from q.

    `p` is the target's distribution at that position; `q` None means the draft
    was chosen deterministically (all of q's mass on it). The draft stands with
    probability min(1, p/q); otherwise a correction is drawn from max(0, p - q),
    normalised. Either way the result is distributed exactly as p (Leviathan et
    al., 2023).
    """
    p_of = dict(zip(p.tokens, p.probs, strict=True))
    q_of = dict(zip(q.tokens, q.probs, strict=True)) if q is not None else {draft: 1.0}
    p_draft, q_draft = p_of.get(draft, 0.0), q_of.get(draft, 0.0)
    if q_draft > 0.0 and rng.random() * q_draft < p_draft:
        return draft
    residual = [(token, prob - q_of.get(token, 0.0)) for token, prob in p_of.items()]
    positive = [(token, mass) for token, mass in residual if mass > 0.0]
    return draw(positive or list(p_of.items()), rng)


def draw(weights: Sequence[tuple[int, float]], rng: random.Random) -> int:
    """One token drawn in proportion to its weight (weights need not sum to 1)."""
    target = rng.random() * sum(weight for _, weight in weights)
    for token, weight in weights:
        target -= weight
        if target < 0.0:
            return token
    return weights[-1][0]


@dataclass(frozen=True, slots=True)
class Speculating:
    """A slot generating this step: it may carry a draft behind its pending token.

    `room` is the most draft tokens that can still become output (what is left
    of max_tokens and of the slot's context).
    """

    slot: Slot
    request_id: str
    pending: int
    room: int
    sampling: SamplingParams


@dataclass(slots=True)
class _Request:
    """The request running in a slot, as speculation tracks it."""

    id: str = ""
    accepted: int = 0
    rejected: int = 0
    random: random.Random = field(default_factory=random.Random)


@dataclass(frozen=True, slots=True)
class DraftCounts:
    """A slot's speculation as reported: its current or last request's draft tokens."""

    accepted: int
    rejected: int
    acceptance: float


class Speculation:
    """The engine's speculative step logic for one model, around its draft strategy."""

    def __init__(self, model: TextModel, strategy: DraftStrategy, n_batch: int) -> None:
        self._model = model
        self._strategy = strategy
        self._n_batch = n_batch
        info = model.info
        # The most tokens a step with drafts may decode. With a sliding window, a decode
        # placed in pieces lets a later piece take window cells that a drafted sequence
        # needs to drop its rejected tokens exactly (llama.cpp reuses a cell that left the
        # window of its sequence's newest position): such a step is one piece.
        self.step_cap = min(n_batch, info.n_ubatch) if info.n_swa and info.n_ubatch else n_batch
        self._requests = [_Request() for _ in range(model.info.n_seq_max)]
        self.policy = DraftPolicy(
            model.info.n_seq_max, strategy.ndraft, adaptive=strategy.adaptive
        )
        self.enabled = True

    @property
    def strategy(self) -> DraftStrategy:
        return self._strategy

    # ---- before the decode -------------------------------------------------------

    def drafts(self, generating: Sequence[Speculating], prefill: int) -> dict[int, Draft]:
        """Draft tokens by slot id for this step; `prefill` prompt tokens wait to join the
        decode. Where `step_cap` is below n_batch, none when the prompts would not leave
        room for a draft: they go first, in a step as large as ever."""
        for item in generating:
            self._track(item)
        room = self.step_cap - len(generating)
        if not self.enabled or (self.step_cap < self._n_batch and prefill >= room):
            return {}
        wishes = [Wish(item.slot.id, item.room) for item in generating]
        lengths = self.policy.plan(wishes, min(prefill, room), self.step_cap)
        requests = [
            DraftRequest(
                slot_id=item.slot.id,
                context=[*item.slot.tokens, item.pending],
                max_tokens=lengths[item.slot.id],
                sampling=item.sampling,
                random=self._requests[item.slot.id].random,
            )
            for item in generating
            if item.slot.id in lengths
        ]
        if not requests:
            return {}
        started = time.perf_counter()
        proposed = self._strategy.propose(requests)
        elapsed = time.perf_counter() - started
        drafts: dict[int, Draft] = {}
        for request, draft in zip(requests, proposed, strict=True):
            tokens = tuple(draft.tokens[: request.max_tokens])
            if tokens:
                given = tuple(draft.distributions[: len(tokens)])
                drafts[request.slot_id] = Draft(tokens, given if len(given) == len(tokens) else ())
        self.policy.drafted(sum(len(draft.tokens) for draft in drafts.values()), elapsed)
        return drafts

    def _track(self, item: Speculating) -> None:
        """A new request in the slot starts from the prior, with its own random stream."""
        if self._requests[item.slot.id].id != item.request_id:
            # Random(None) seeds from the OS: a request without a seed is not reproducible.
            stream = random.Random(item.sampling.seed)
            self._requests[item.slot.id] = _Request(id=item.request_id, random=stream)
            # A seeded or greedy request must give its answer again: where its strategy's
            # drafts follow from its context alone, so must the choice of when to draft.
            reproducible = item.sampling.reproducible and self._strategy.reproducible
            self.policy.reset(item.slot.id, reproducible=reproducible)

    def decoded(self, rows: int, prefill: int, seconds: float) -> None:
        self.policy.decoded(rows, prefill, seconds)

    def stepped(self, slots: int, drafted: bool, tokens: int, seconds: float) -> None:
        self.policy.stepped(slots, drafted, tokens, seconds)

    # ---- after the decode --------------------------------------------------------

    def verify(self, slot_id: int, sampler: Sampler, first_row: int, draft: Draft) -> list[int]:
        """The target's tokens for the rows of a drafted part, up to the first disagreement.

        Row i holds the logits after the part's i-th token. Every token but the
        last returned equals its draft token (it is in the KV already); the last
        is the target's own: a correction, or the bonus token after a draft
        that stood whole.
        """
        rng = self._requests[slot_id].random
        chosen: list[int] = []
        for offset, token in enumerate(draft.tokens):
            q = draft.distributions[offset] if draft.distributions else None
            p = None if q is None else sampler.distribution(first_row + offset, _SUPPORT_LIMIT)
            if p is None:
                # The chain draws as it would without a draft: it stands iff the chain draws it.
                picked = sampler.sample(first_row + offset)
            else:
                picked = accept_or_correct(p, q, token, rng)
                sampler.accept(picked)
            chosen.append(picked)
            if picked != token:
                break
        else:
            chosen.append(sampler.sample(first_row + len(draft.tokens)))
        self.policy.verified(slot_id, len(draft.tokens), len(chosen) - 1)
        return chosen

    def settled(self, slot_id: int, accepted: int, rejected: int) -> None:
        """Count what became of a slot's draft: tokens output, and tokens dropped."""
        request = self._requests[slot_id]
        request.accepted += accepted
        request.rejected += rejected

    def cut(self, slot: Slot) -> bool:
        """Drop the rejected draft tokens from the KV; False when it cannot be done exactly."""
        keep = len(slot.tokens)
        if self._model.trim_floor(slot.seq_id) > keep:
            return False
        self._model.seq_remove(slot.seq_id, keep, -1)
        return True

    def disable(self, reason: str) -> None:
        log.error("speculative decoding is off for %s: %s", self._model.info.id, reason)
        self.enabled = False

    # ---- reporting -----------------------------------------------------------------

    def counts(self, slot_id: int) -> DraftCounts:
        request = self._requests[slot_id]
        return DraftCounts(request.accepted, request.rejected, self.policy.acceptance[slot_id])

    def close(self) -> None:
        self._strategy.close()
