"""Speculative decoding on the engine side: which slots draft, and which draft tokens stand.

Each step the adaptive policy decides how many tokens each generating slot
should draft, the model's draft strategy proposes them, and the engine puts
them into the step's decode behind the slot's pending token. Afterwards the
target's own sampler chain walks the rows: a draft token stands only if the
target would have produced it (`verify`), so the output is the target's, token
for token when greedy and in distribution when sampling.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kronk_core.backend import Sampler, TextModel
from kronk_core.drafts import Draft, DraftRequest, DraftStrategy
from kronk_core.slots import Slot
from kronk_core.types import SamplingParams, TokenDistribution

log = logging.getLogger(__name__)

# Explicit target distributions are used only while this small (top-k keeps them so);
# larger ones are verified by sampling and comparing, which is exact too.
_SUPPORT_LIMIT = 512
# What a new request's drafts are assumed to achieve until it has drafted.
_PRIOR_ACCEPTANCE = 0.5
# Weight of each verified draft token in the acceptance estimate.
_ACCEPTANCE_STEP = 0.2
# A speculating slot that stopped drafting probes again once a probe costs at most this
# share of the steps it waited.
_PROBE_SHARE = 0.01
# Prompt tokens cost less than rows with logits; this is their weight in the step's cost.
_PREFILL_WEIGHT = 0.5


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
    return _draw(positive or list(p_of.items()), rng)


def _draw(weights: Sequence[tuple[int, float]], rng: random.Random) -> int:
    """One token drawn in proportion to its weight (weights need not sum to 1)."""
    target = rng.random() * sum(weight for _, weight in weights)
    for token, weight in weights:
        target -= weight
        if target < 0.0:
            return token
    return weights[-1][0]


class StepCost:
    """Seconds one decode takes, as `base + per_row x rows`, fitted to the steps seen.

    Rows are the tokens whose logits the step reads (one per generating slot,
    plus draft tokens). The fit decays, so it follows the context as it grows;
    while every step has the same number of rows, `prior_ratio` (per_row / base)
    splits the time.
    """

    def __init__(self, decay: float = 0.95, prior_ratio: float = 0.25) -> None:
        self._decay = decay
        self._ratio = prior_ratio
        self._sums = [0.0] * 5  # weight, x, y, xx, xy

    @property
    def known(self) -> bool:
        return self._sums[0] > 0.0

    def observe(self, rows: float, seconds: float) -> None:
        decay = self._decay
        for index, value in enumerate((1.0, rows, seconds, rows * rows, rows * seconds)):
            self._sums[index] = self._sums[index] * decay + value

    def estimate(self) -> tuple[float, float]:
        """(base, per_row) in seconds."""
        weight, x, y, xx, xy = self._sums
        mean_x, mean_y = x / weight, y / weight
        spread = xx / weight - mean_x * mean_x
        if spread > 0.25:
            per_row = (xy / weight - mean_x * mean_y) / spread
            base = mean_y - per_row * mean_x
            if per_row > 0.0 and base > 0.0:
                self._ratio = per_row / base
                return base, per_row
        base = mean_y / (1.0 + self._ratio * mean_x)
        return base, base * self._ratio


@dataclass(frozen=True, slots=True)
class Speculating:
    """A slot generating this step: it may carry a draft behind its pending token.

    `room` is the most draft tokens that can still become output (what is left
    of max_tokens and of the slot's context).
    """

    slot: Slot
    request_id: int
    pending: int
    room: int
    sampling: SamplingParams


@dataclass(slots=True)
class _SlotDrafting:
    """What speculation tracks for the request running in one slot."""

    request_id: int = 0
    acceptance: float = _PRIOR_ACCEPTANCE
    idle_steps: int = 0
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
        self._slots = [_SlotDrafting() for _ in range(model.info.n_seq_max)]
        self._cost = StepCost()
        self._draft_seconds = 0.0  # per proposed token, smoothed
        self.enabled = True

    # ---- before the decode -------------------------------------------------------

    def drafts(self, generating: Sequence[Speculating], prefill: int) -> dict[int, Draft]:
        """Draft tokens by slot id for this step; `prefill` prompt tokens join the decode."""
        for item in generating:
            self._track(item)
        lengths = self.plan(generating, prefill)
        if not lengths:
            return {}
        asking = [item for item in generating if lengths.get(item.slot.id, 0) > 0]
        requests = [
            DraftRequest(
                slot_id=item.slot.id,
                context=[*item.slot.tokens, item.pending],
                max_tokens=lengths[item.slot.id],
                sampling=item.sampling,
                random=self._slots[item.slot.id].random,
            )
            for item in asking
        ]
        started = time.perf_counter()
        proposed = self._strategy.propose(requests)
        elapsed = time.perf_counter() - started
        drafts: dict[int, Draft] = {}
        count = 0
        for request, draft in zip(requests, proposed, strict=True):
            tokens = draft.tokens[: request.max_tokens]
            if not tokens:
                continue
            given = draft.distributions[: len(tokens)]
            drafts[request.slot_id] = Draft(tokens, given if len(given) == len(tokens) else ())
            count += len(tokens)
        if count:
            self._draft_seconds += 0.2 * (elapsed / count - self._draft_seconds)
        return drafts

    def plan(self, generating: Sequence[Speculating], prefill: int) -> dict[int, int]:
        """How many tokens each slot drafts: those expected to pay for the time they add.

        The j-th draft token of a slot whose drafts are accepted at rate a adds
        a^j expected tokens and one row (plus drafting it) to the step's time. It
        is drafted while that beats the step's tokens per second without it,
        best first: low acceptance, or a batch already full of other slots'
        tokens, leaves nothing worth drafting. A slot left without drafts probes
        with one token once the steps it waited make the probe cheap.
        """
        if not self.enabled or not self._cost.known:
            return {}
        base, per_row = self._cost.estimate()
        rows = len(generating)
        step_seconds = base + per_row * (rows + _PREFILL_WEIGHT * prefill)
        expected = float(rows)
        added = per_row + self._draft_seconds
        budget = self._n_batch - rows - prefill
        offers: list[tuple[float, int]] = []
        for item in generating:
            acceptance = self._slots[item.slot.id].acceptance
            gain = 1.0
            for _ in range(min(item.room, self._strategy.ndraft)):
                gain *= acceptance
                offers.append((gain, item.slot.id))
        lengths: dict[int, int] = {}
        for gain, slot_id in sorted(offers, reverse=True):
            if budget <= 0 or gain * step_seconds <= expected * added:
                break
            lengths[slot_id] = lengths.get(slot_id, 0) + 1
            expected += gain
            step_seconds += added
            budget -= 1
        probe_after = added / (_PROBE_SHARE * step_seconds)
        for item in generating:
            state = self._slots[item.slot.id]
            if item.slot.id in lengths:
                state.idle_steps = 0
            elif item.room > 0 and budget > 0 and state.idle_steps >= probe_after:
                lengths[item.slot.id] = 1
                state.idle_steps = 0
                budget -= 1
            else:
                state.idle_steps += 1
        return lengths

    def _track(self, item: Speculating) -> None:
        """A new request in the slot starts from the prior, with its own random stream."""
        state = self._slots[item.slot.id]
        if state.request_id != item.request_id:
            seed = item.sampling.seed
            self._slots[item.slot.id] = _SlotDrafting(
                request_id=item.request_id,
                random=random.Random(seed) if seed is not None else random.Random(),
            )

    def decoded(self, rows: int, prefill: int, seconds: float) -> None:
        """A decode of `rows` logit rows and `prefill` prompt tokens took `seconds`."""
        if not prefill:
            self._cost.observe(rows, seconds)

    # ---- after the decode --------------------------------------------------------

    def verify(self, slot_id: int, sampler: Sampler, first_row: int, draft: Draft) -> list[int]:
        """The target's tokens for the rows of a drafted part, up to the first disagreement.

        Row i holds the logits after the part's i-th token. Every token but the
        last returned equals its draft token (it is in the KV already); the last
        is the target's own: a correction, or the bonus token after a draft
        that stood whole.
        """
        state = self._slots[slot_id]
        chosen: list[int] = []
        for offset, token in enumerate(draft.tokens):
            q = draft.distributions[offset] if draft.distributions else None
            p = None if q is None else sampler.distribution(first_row + offset, _SUPPORT_LIMIT)
            if p is None:
                # The chain draws as it would without a draft: accepted iff it draws the token.
                picked = sampler.sample(first_row + offset)
            else:
                picked = accept_or_correct(p, q, token, state.random)
                sampler.accept(picked)
            chosen.append(picked)
            if picked != token:
                break
        else:
            chosen.append(sampler.sample(first_row + len(draft.tokens)))
        matched = len(chosen) - 1
        outcomes = [1.0] * matched + ([0.0] if matched < len(draft.tokens) else [])
        for outcome in outcomes:
            state.acceptance += _ACCEPTANCE_STEP * (outcome - state.acceptance)
        return chosen

    def settled(self, slot_id: int, accepted: int, rejected: int) -> None:
        """Count what became of a slot's draft: tokens emitted, and tokens dropped."""
        state = self._slots[slot_id]
        state.accepted += accepted
        state.rejected += rejected

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
        state = self._slots[slot_id]
        return DraftCounts(state.accepted, state.rejected, state.acceptance)

    def close(self) -> None:
        self._strategy.close()
