"""The adaptive policy of speculative decoding: when drafting pays, on measured costs.

Step costs here are those measured on the default model on this kind of
machine: a decode takes about 20 ms plus 3.5 ms per extra row with logits.
"""

from __future__ import annotations

import random

import pytest

from kronk_core.runtime.draft_policy import (
    EXPLORE_EVERY,
    PROBE_SHARE,
    DraftPolicy,
    Payoff,
    StepCost,
    Wish,
)

BASE = 0.020
PER_ROW = 0.0035


def measured(rows: int = 4) -> StepCost:
    """A cost model that has seen decodes of 1..rows rows."""
    cost = StepCost()
    for _ in range(50):
        for count in range(1, rows + 1):
            cost.observe(count, BASE + PER_ROW * count)
    return cost


def test_the_cost_model_fits_the_decodes_it_saw() -> None:
    base, per_row = measured().estimate()
    assert base == pytest.approx(BASE, rel=0.05)
    assert per_row == pytest.approx(PER_ROW, rel=0.05)


def test_same_sized_steps_split_by_the_last_fitted_ratio() -> None:
    """Drafting stopped and the context grows: the time is followed, the split is kept."""
    cost = measured()
    scale = 1.0
    for _ in range(300):
        scale *= 1.003
        cost.observe(1, scale * (BASE + PER_ROW))
    base, per_row = cost.estimate()
    assert per_row / base == pytest.approx(PER_ROW / BASE, rel=0.1)
    assert base + per_row == pytest.approx(scale * (BASE + PER_ROW), rel=0.05)


def test_nothing_is_drafted_before_a_decode_was_timed() -> None:
    assert DraftPolicy(1, ndraft=8).plan([Wish(0, 100)], prefill=0, n_batch=2048) == {}


def policy(acceptance: float, slots: int = 1, ndraft: int = 16) -> DraftPolicy:
    chosen = DraftPolicy(slots, ndraft=ndraft, cost=measured())
    chosen.acceptance[:] = [acceptance] * slots
    return chosen


def test_draft_length_follows_acceptance() -> None:
    lengths = [
        policy(rate).plan([Wish(0, 100)], prefill=0, n_batch=2048).get(0, 0)
        for rate in (0.1, 0.5, 0.8, 0.95, 1.0)
    ]
    assert lengths[0] == 0
    assert lengths == sorted(lengths)
    assert lengths[-1] == 16  # every token stands: draft all that ndraft allows


def test_room_and_the_batch_bound_the_draft() -> None:
    assert policy(1.0).plan([Wish(0, 3)], prefill=0, n_batch=2048) == {0: 3}
    assert sum(policy(1.0, 2).plan([Wish(0, 50), Wish(1, 50)], 0, n_batch=10).values()) == 8


def test_a_batch_full_of_other_slots_leaves_less_worth_drafting() -> None:
    alone = policy(0.6).plan([Wish(0, 100)], prefill=0, n_batch=2048)
    crowded = policy(0.6, slots=16).plan([Wish(i, 100) for i in range(16)], 0, n_batch=2048)
    assert alone[0] >= 1
    assert max(crowded.values(), default=0) < alone[0]
    assert policy(0.6).plan([Wish(0, 100)], prefill=1024, n_batch=2048).get(0, 0) < alone[0]


def test_nothing_accepted_costs_less_than_three_percent() -> None:
    """A workload where no draft ever stands: after the first miss the slot only probes."""
    chosen = DraftPolicy(1, ndraft=8, cost=measured())
    plain = spent = 0.0
    for _ in range(2000):
        length = chosen.plan([Wish(0, 1000)], prefill=0, n_batch=2048).get(0, 0)
        if length:
            chosen.verified(0, drafted=length, matched=0)
        plain += BASE + PER_ROW
        spent += BASE + PER_ROW * (1 + length)
    assert spent / plain - 1 < 0.03
    assert spent / plain - 1 < 2 * PROBE_SHARE  # the probes alone, after the first misses


def test_a_slot_that_turns_predictable_speculates_again() -> None:
    chosen = DraftPolicy(1, ndraft=8, cost=measured())
    chosen.acceptance[0] = 0.0
    steps = 0
    while chosen.plan([Wish(0, 1000)], prefill=0, n_batch=2048).get(0, 0) < 8:
        steps += 1
        assert steps < 500
        chosen.verified(0, drafted=1, matched=1)  # each probe stands
    assert chosen.acceptance[0] > 0.9


def test_a_new_request_starts_from_the_prior() -> None:
    chosen = policy(0.0)
    chosen.reset(0)
    assert chosen.plan([Wish(0, 100)], prefill=0, n_batch=2048).get(0, 0) >= 1


def test_new_requests_start_from_what_earlier_requests_achieved() -> None:
    """Requests whose drafts never stand teach the next ones to wait for probes; requests
    whose drafts stand teach them to draft from their first step."""
    chosen = DraftPolicy(1, ndraft=8, cost=measured())
    drafted_per_request = []
    for _ in range(8):
        chosen.reset(0)
        drafted = 0
        for _ in range(30):
            length = chosen.plan([Wish(0, 1000)], prefill=0, n_batch=2048).get(0, 0)
            if length:
                chosen.verified(0, drafted=length, matched=0)
                drafted += length
        drafted_per_request.append(drafted)
    assert drafted_per_request[0] >= 5
    assert drafted_per_request[-1] <= 2  # what the probes alone draft in 30 steps
    assert chosen.prior < 0.2
    for _ in range(6):
        chosen.reset(0)
        chosen.verified(0, drafted=8, matched=8)
    chosen.reset(0)
    assert chosen.acceptance[0] > 0.5
    assert chosen.plan([Wish(0, 1000)], prefill=0, n_batch=2048).get(0, 0) >= 4


def simulate(
    chosen: DraftPolicy, slots: int, steps: int, acceptance: float, hidden_per_draft: float
) -> tuple[float, float]:
    """Run the policy over `steps` engine steps of `slots` slots whose drafts stand with
    probability `acceptance` (each judged in turn, as verification does), where each draft
    token also costs `hidden_per_draft` seconds that the cost model does not see (work
    outside the timed decode and drafting, a decode time that is not linear in its rows).
    Returns (tokens per second, tokens per second never drafting)."""
    rng = random.Random(1)
    tokens = seconds = 0.0
    wishes = [Wish(slot, 1000) for slot in range(slots)]
    for _ in range(steps):
        lengths = chosen.plan(wishes, prefill=0, n_batch=2048)
        out = slots
        for slot, length in lengths.items():
            matched = next((i for i in range(length) if rng.random() >= acceptance), length)
            chosen.verified(slot, drafted=length, matched=matched)
            out += matched
        rows = slots + sum(lengths.values())
        decode = BASE + PER_ROW * rows
        chosen.decoded(rows, 0, decode)
        step = decode + hidden_per_draft * (rows - slots)
        chosen.stepped(slots, bool(lengths), out, step)
        tokens += out
        seconds += step
    return tokens / seconds, slots / (BASE + PER_ROW * slots)


@pytest.mark.parametrize("slots", [1, 4])
def test_drafts_that_cost_what_the_cost_model_misses_stop(slots: int) -> None:
    """Half the drafts stand, but each draft token costs 15 ms the cost model does not see:
    drafting loses; the measured payoff turns it off (exploring steps aside), so it costs
    less than 3% against never drafting."""
    chosen = DraftPolicy(slots, ndraft=8, cost=measured())
    rate, plain = simulate(chosen, slots, 3000, 0.5, 0.015)
    assert rate >= 0.97 * plain


@pytest.mark.parametrize("slots", [1, 4])
def test_drafts_that_pay_keep_paying(slots: int) -> None:
    """Cheap drafts that mostly stand: drafting wins and stays on but for the plain steps
    that keep the comparison current."""
    chosen = DraftPolicy(slots, ndraft=8, cost=measured())
    rate, plain = simulate(chosen, slots, 3000, 0.8, 0.0)
    assert rate >= 1.1 * plain


def test_each_batch_size_has_its_own_verdict() -> None:
    payoff = DraftPolicy(8, ndraft=8, cost=measured()).payoff
    for _ in range(20):
        payoff.observe(1, True, 3, 0.030)  # one slot: drafts pay
        payoff.observe(1, False, 1, 0.025)
        payoff.observe(8, True, 9, 0.060)  # eight slots: they do not
        payoff.observe(8, False, 8, 0.040)
    steps = 200
    one = [payoff.drafts_now(1) for _ in range(steps)]
    eight = [payoff.drafts_now(8) for _ in range(steps)]
    # Each explores the other arm now and then, the less often the wider the gap.
    assert 1 <= one.count(False) <= steps // EXPLORE_EVERY
    assert 1 <= eight.count(True) <= steps // EXPLORE_EVERY
    assert Payoff.bucket(6) == Payoff.bucket(8) != Payoff.bucket(9)
