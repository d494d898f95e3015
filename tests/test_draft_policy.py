"""The adaptive policy of speculative decoding: when drafting pays, on measured costs.

Step costs here are those measured on the default model on this kind of
machine: a decode takes about 20 ms plus 3.5 ms per extra row with logits.
"""

from __future__ import annotations

import pytest

from kronk_core.draft_policy import PROBE_SHARE, DraftPolicy, StepCost, Wish

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
