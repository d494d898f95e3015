"""When speculative decoding pays: per-slot acceptance, the cost of a step, and draft lengths.

Every draft token costs time for certain (one more row in the decode, plus
drafting it) and pays only if the target accepts it. The policy weighs the
two with what it has measured: each slot's acceptance rate and how a decode's
time grows with its rows. Speculation backs off when acceptance is low or
when the batch is already full of other slots' tokens, and probes now and
then so that a slot whose text turned predictable speculates again. Over all
of it, the output rate of whole steps with drafts and without, per batch size,
decides whether a step drafts at all (`Payoff`).

Measured times differ run to run, and drafts change a step's batch layout, which changes
how llama.cpp rounds: a request that must be reproducible (a seed, or greedy) and has the
model to itself drafts by a fixed cost and its own drafts' outcomes alone
(`DraftPolicy.reset`), so that the same request decodes the same batches again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# What the first request's drafts are assumed to achieve until it has drafted; later
# requests start from what earlier ones achieved (`DraftPolicy.prior`).
PRIOR_ACCEPTANCE = 0.5
# Weight of each finished request's acceptance in the prior of the next ones.
_PRIOR_STEP = 0.3
# Weight of each verified draft token in the acceptance estimate.
_ACCEPTANCE_STEP = 0.2
# A slot that stopped drafting probes with one token once that costs at most this share of
# the steps it waited.
PROBE_SHARE = 0.01
# Prompt tokens cost less than rows with logits; their weight in the step's cost and work.
_PREFILL_WEIGHT = 0.5
# What one more row adds to a one-row decode, relative to it: assumed until measured, and
# always for a reproducible request (no timing may decide its drafts). Measured on a CPU:
# 0.175 for Gemma 3 270M; on a GPU far less, so this errs towards drafting less.
NOMINAL_ROW_RATIO = 0.25


class StepCost:
    """Seconds one decode takes: `scale x (1 + ratio x (rows - 1))`, learned from the steps seen.

    Rows are the tokens whose logits the step reads (one per generating slot,
    plus draft tokens). `scale`, the time of a one-row step, follows every step
    (it grows with the context); `ratio`, what one more row adds relative to
    it, is learned only from steps of several rows, so a stretch of same-sized
    steps leaves it as it was (at first `prior_ratio`).
    """

    def __init__(self, prior_ratio: float = NOMINAL_ROW_RATIO, smoothing: float = 0.1) -> None:
        self.scale = 0.0
        self.ratio = prior_ratio
        self._smoothing = smoothing

    @property
    def known(self) -> bool:
        return self.scale > 0.0

    def observe(self, rows: int, seconds: float) -> None:
        extra = max(0, rows - 1)
        if not self.known:
            self.scale = seconds / (1.0 + self.ratio * extra)
            return
        if extra:
            implied = (seconds / self.scale - 1.0) / extra
            self.ratio += self._smoothing * (min(1.0, max(0.0, implied)) - self.ratio)
        self.scale += self._smoothing * (seconds / (1.0 + self.ratio * extra) - self.scale)

    def estimate(self) -> tuple[float, float]:
        """(base, per_row) in seconds: a step of n rows takes base + per_row x n."""
        per_row = self.scale * self.ratio
        return self.scale - per_row, per_row


# Every this many steps of a batch size, at least, the arm (drafting or not) that measured
# slower runs instead, so that both rates stay current as the text and the context change;
# less often the slower it is, so that exploring costs about EXPLORE_BUDGET of the rate.
EXPLORE_EVERY = 16
EXPLORE_BUDGET = 0.01
# Steps of an arm before its rate is trusted.
_MIN_SAMPLES = 6


class Payoff:
    """What drafting really returns: output tokens per second of whole engine steps (decode,
    drafting, verifying, sampling, detokenizing) with drafts and without, per number of
    generating slots. The cost model predicts; this measures, so a cost the model does not
    see (sampling every verified row at a high temperature, say) still turns drafting off
    where it does not pay."""

    def __init__(self, smoothing: float = 0.15) -> None:
        self._smoothing = smoothing
        self._rates: dict[tuple[int, bool], float] = {}
        self._samples: dict[tuple[int, bool], int] = {}
        self._steps: dict[int, int] = {}

    @staticmethod
    def bucket(slots: int) -> int:
        """Batch sizes alike enough to share a verdict: 1, 2, 3, 4, 5-8, 9-16, ..."""
        return slots if slots <= 4 else 4 + (slots - 1).bit_length() - 2

    def observe(self, slots: int, drafted: bool, tokens: int, seconds: float) -> None:
        if seconds <= 0.0:
            return
        key = (self.bucket(slots), drafted)
        rate = tokens / seconds
        known = self._rates.get(key)
        self._rates[key] = rate if known is None else known + self._smoothing * (rate - known)
        self._samples[key] = self._samples.get(key, 0) + 1

    def rate(self, slots: int, drafted: bool) -> float | None:
        key = (self.bucket(slots), drafted)
        return self._rates[key] if self._samples.get(key, 0) >= _MIN_SAMPLES else None

    def drafts_now(self, slots: int) -> bool:
        """Whether this step may draft: the arm that measured faster, the other one every
        EXPLORE_EVERY steps; until both are known, drafting, with a plain step as often."""
        bucket = self.bucket(slots)
        step = self._steps[bucket] = self._steps.get(bucket, 0) + 1
        plain, drafting = self.rate(slots, False), self.rate(slots, True)
        if plain is None or drafting is None:
            return not (step % EXPLORE_EVERY == 0 and plain is None)
        faster, slower = max(plain, drafting), min(plain, drafting)
        every = max(EXPLORE_EVERY, math.ceil((1.0 - slower / faster) / EXPLORE_BUDGET))
        return (drafting > plain) != (step % every == 0)


@dataclass(frozen=True, slots=True)
class Wish:
    """A generating slot this step, and the most draft tokens that could still be output."""

    slot_id: int
    room: int


class DraftPolicy:
    """Draft lengths per slot, from measured acceptance and step costs (engine thread only)."""

    def __init__(
        self, n_slots: int, ndraft: int, cost: StepCost | None = None, adaptive: bool = True
    ) -> None:
        self.ndraft = ndraft
        self.adaptive = adaptive
        self.cost = cost or StepCost()
        self.acceptance = [PRIOR_ACCEPTANCE] * n_slots
        # Where a new request's acceptance starts: a draft model that never agrees, or text
        # that never repeats, should not cost every new request a few rounds of drafts.
        self.prior = PRIOR_ACCEPTANCE
        self._verified = [False] * n_slots
        self._reproducible = [False] * n_slots
        self._idle_steps = [0] * n_slots
        self._draft_seconds = 0.0  # drafting one token, smoothed
        self.payoff = Payoff()

    def reset(self, slot_id: int, *, reproducible: bool = False) -> None:
        """A new request in the slot: it starts from what earlier requests' drafts achieved,
        or, `reproducible`, from PRIOR_ACCEPTANCE: then whenever it has the model to itself,
        its drafts follow from its own tokens alone (`plan`)."""
        if self._verified[slot_id]:
            self.prior += _PRIOR_STEP * (self.acceptance[slot_id] - self.prior)
        self.acceptance[slot_id] = PRIOR_ACCEPTANCE if reproducible else self.prior
        self._verified[slot_id] = False
        self._reproducible[slot_id] = reproducible
        self._idle_steps[slot_id] = 0

    def _all_it_can(self, wishes: Sequence[Wish], budget: int) -> dict[int, int]:
        lengths: dict[int, int] = {}
        for wish in wishes:
            length = min(wish.room, self.ndraft, budget)
            if length > 0:
                lengths[wish.slot_id] = length
                budget -= length
        return lengths

    def verified(self, slot_id: int, drafted: int, matched: int) -> None:
        """`matched` leading tokens of a `drafted`-token draft stood (the first miss ends it)."""
        self._verified[slot_id] = True
        outcomes = [1.0] * matched + ([0.0] if matched < drafted else [])
        for outcome in outcomes:
            self.acceptance[slot_id] += _ACCEPTANCE_STEP * (outcome - self.acceptance[slot_id])

    def decoded(self, rows: int, prefill: int, seconds: float) -> None:
        """A decode of `rows` logit rows and `prefill` prompt tokens took `seconds`."""
        if not prefill:
            self.cost.observe(rows, seconds)

    def stepped(self, slots: int, drafted: bool, tokens: int, seconds: float) -> None:
        """A whole engine step of `slots` generating slots (no prompt tokens) output
        `tokens` tokens in `seconds`, with drafts or without."""
        self.payoff.observe(slots, drafted, tokens, seconds)

    def drafted(self, tokens: int, seconds: float) -> None:
        """The draft strategy took `seconds` to propose `tokens` tokens."""
        if tokens:
            self._draft_seconds += 0.2 * (seconds / tokens - self._draft_seconds)

    def plan(self, wishes: Sequence[Wish], prefill: int, n_batch: int) -> dict[int, int]:
        """How many tokens each slot drafts this step (slots absent draft none).

        The j-th draft token of a slot whose drafts stand at rate a adds a^j
        expected tokens and one row, plus drafting it, to the step's time. It is
        drafted while that beats the step's tokens per second without it, best
        first: low acceptance, or a batch already full of other slots' tokens,
        leaves nothing worth drafting. A slot left without drafts probes with one
        token once the steps it waited make the probe cheap. Not adaptive: every
        slot drafts all it can.

        A reproducible request alone in the step (no other slot generating, no prompt
        waiting) is planned on NOMINAL_ROW_RATIO instead of measured times, and the
        measured payoff is not asked: its drafts, and so its batches, then follow from its
        own tokens, as its acceptance and idle steps do.
        """
        if not self.adaptive:
            return self._all_it_can(wishes, n_batch - len(wishes) - prefill)
        if len(wishes) == 1 and not prefill and self._reproducible[wishes[0].slot_id]:
            return self._lengths(wishes, 0, n_batch, 1.0 - NOMINAL_ROW_RATIO, NOMINAL_ROW_RATIO)
        if not self.cost.known:
            return {}
        if not prefill and not self.payoff.drafts_now(len(wishes)):
            return {}
        base, per_row = self.cost.estimate()
        return self._lengths(wishes, prefill, n_batch, base, per_row, self._draft_seconds)

    def _lengths(
        self,
        wishes: Sequence[Wish],
        prefill: int,
        n_batch: int,
        base: float,
        per_row: float,
        draft_seconds: float = 0.0,
    ) -> dict[int, int]:
        """`plan` for a step of `base + per_row x rows` seconds, where drafting a token
        takes `draft_seconds`."""
        rows = len(wishes)
        # Prompt tokens are work done too, worth what they cost: a batch full of them is a
        # batch that is already used well.
        load = rows + _PREFILL_WEIGHT * prefill
        step_seconds = base + per_row * load
        expected = load
        added = per_row + draft_seconds
        budget = n_batch - rows - prefill
        offers: list[tuple[float, int]] = []
        for wish in wishes:
            gain = 1.0
            for _ in range(min(wish.room, self.ndraft)):
                gain *= self.acceptance[wish.slot_id]
                offers.append((gain, wish.slot_id))
        lengths: dict[int, int] = {}
        for gain, slot_id in sorted(offers, reverse=True):
            if budget <= 0 or gain * step_seconds <= expected * added:
                break
            lengths[slot_id] = lengths.get(slot_id, 0) + 1
            expected += gain
            step_seconds += added
            budget -= 1
        probe_after = added / (PROBE_SHARE * step_seconds)
        for wish in wishes:
            if wish.slot_id in lengths:
                self._idle_steps[wish.slot_id] = 0
            elif wish.room > 0 and budget > 0 and self._idle_steps[wish.slot_id] >= probe_after:
                lengths[wish.slot_id] = 1
                self._idle_steps[wish.slot_id] = 0
                budget -= 1
            else:
                self._idle_steps[wish.slot_id] += 1
        return lengths
