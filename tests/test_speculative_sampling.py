"""The acceptance rule of speculative sampling, as a pure function on a small vocabulary.

Whatever the draft proposes, the emitted token must be distributed as the
target's p. Each check draws enough samples that a wrong rule fails it: the
same test run on three plausible wrong rules rejects every one of them.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest

from kronk_core.contract.types import TokenDistribution
from kronk_core.runtime.speculation import accept_or_correct

SAMPLES = 40_000
# Chi-square critical value for 5 degrees of freedom at p = 1e-4: a correct rule fails
# this test once in ten thousand seeds; the wrong ones below exceed it many times over.
CRITICAL_5_DOF = 25.74

# Six tokens. The draft's q favours other tokens than the target's p, gives mass to a
# token p never emits (15), and none to one p does (14).
P = TokenDistribution((10, 11, 12, 13, 14, 16), (0.35, 0.25, 0.15, 0.1, 0.1, 0.05))
Q = TokenDistribution((10, 11, 12, 13, 15, 16), (0.1, 0.4, 0.05, 0.25, 0.15, 0.05))

Rule = Callable[[TokenDistribution, TokenDistribution | None, int, random.Random], int]


def draw(distribution: TokenDistribution, rng: random.Random) -> int:
    return rng.choices(distribution.tokens, weights=distribution.probs)[0]


def chi_square(counts: Counter[int], p: TokenDistribution) -> float:
    total = sum(counts.values())
    if set(counts) - set(p.tokens):
        return float("inf")  # emitted a token the target never emits
    return sum(
        (counts[token] - total * prob) ** 2 / (total * prob)
        for token, prob in zip(p.tokens, p.probs, strict=True)
    )


def emitted(rule: Rule, q: TokenDistribution | None, draft: int | None = None) -> Counter[int]:
    rng = random.Random(1234)
    counts: Counter[int] = Counter()
    for _ in range(SAMPLES):
        proposed = draft if q is None and draft is not None else draw(q or P, rng)
        counts[rule(P, q, proposed, rng)] += 1
    return counts


def test_draws_from_the_draft_distribution_come_out_as_the_target() -> None:
    assert chi_square(emitted(accept_or_correct, Q), P) < CRITICAL_5_DOF


@pytest.mark.parametrize("draft", [10, 13, 15])
def test_a_deterministic_draft_comes_out_as_the_target(draft: int) -> None:
    """Prompt lookup's case: q puts all its mass on one token, likely, unlikely or impossible."""
    assert chi_square(emitted(accept_or_correct, None, draft), P) < CRITICAL_5_DOF


def test_drafts_stand_as_often_as_the_two_distributions_overlap() -> None:
    """The rule is also efficient: a draft stands with probability sum(min(p, q))."""
    rng = random.Random(99)
    overlap = sum(min(P.prob(t), Q.prob(t)) for t in set(P.tokens) | set(Q.tokens))
    stood = 0
    for _ in range(SAMPLES):
        proposed = draw(Q, rng)
        stood += accept_or_correct(P, Q, proposed, rng) == proposed
    assert abs(stood / SAMPLES - overlap) < 0.01


def test_identical_distributions_accept_every_draft() -> None:
    rng = random.Random(5)
    for _ in range(2000):
        proposed = draw(P, rng)
        assert accept_or_correct(P, P, proposed, rng) == proposed


def inverted_ratio(
    p: TokenDistribution, q: TokenDistribution | None, draft: int, rng: random.Random
) -> int:
    """Wrong: accepts with min(1, q/p) instead of min(1, p/q)."""
    q = q or TokenDistribution((draft,), (1.0,))
    if p.prob(draft) > 0 and rng.random() < min(1.0, q.prob(draft) / p.prob(draft)):
        return draft
    return accept_or_correct(p, q, -1, rng)  # a token q never proposes: the residual draw


def resample_from_target(
    p: TokenDistribution, q: TokenDistribution | None, draft: int, rng: random.Random
) -> int:
    """Wrong: right acceptance, but a rejected draft is replaced by a fresh draw from p."""
    q = q or TokenDistribution((draft,), (1.0,))
    if rng.random() * q.prob(draft) < p.prob(draft):
        return draft
    return draw(p, rng)


def accept_if_possible(
    p: TokenDistribution, q: TokenDistribution | None, draft: int, rng: random.Random
) -> int:
    """Wrong: keeps every draft the target could have produced."""
    return draft if p.prob(draft) > 0 else draw(p, rng)


@pytest.mark.parametrize("rule", [inverted_ratio, resample_from_target, accept_if_possible])
def test_the_check_rejects_wrong_rules(rule: Rule) -> None:
    assert chi_square(emitted(rule, Q), P) > 4 * CRITICAL_5_DOF
