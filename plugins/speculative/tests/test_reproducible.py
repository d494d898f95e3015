"""Identical seeded or greedy requests on an idle server give identical answers, with
speculation on (prompt lookup, the default) and the default cache.

llama.cpp's CPU kernels round differently for each batch layout and for each place of a
sequence's cells in the KV pool (docs/caching.md, "Numerics"), and a near-tie then flips.
So a reproducible request that has the model to itself drafts by its own tokens alone,
never by measured times or by what other requests' drafts achieved; it goes back to the
slot that last decoded its prompt, and decodes the prompt's last chunk again as it was
(docs/speculative.md, "Reproducible answers").
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kronk_api import ServerSettings, create_app
from kronk_core.runtime.draft_policy import DraftPolicy, Wish
from kronk_llamacpp.packaged import DEFAULT_MODEL_ID

# Real models throughout: the full tier (docs/testing.md).
pytestmark = pytest.mark.model

# ---- the policy: what decides a reproducible request's drafts ---------------------------


def drafts_of_one_request(policy: DraftPolicy, *, reproducible: bool, seed: int) -> list[int]:
    """The draft lengths of one request alone on the model, whose drafts stand as a fixed
    function of the step (the same text), while the steps take times drawn from `seed`."""
    timing = random.Random(seed)
    policy.reset(0, reproducible=reproducible)
    lengths = []
    for step in range(300):
        length = policy.plan([Wish(0, 1000)], prefill=0, n_batch=2048).get(0, 0)
        lengths.append(length)
        if length:
            policy.verified(0, drafted=length, matched=min(length, step % 7))
        seconds = timing.uniform(0.01, 0.03) * (1 + 0.2 * length)
        policy.decoded(1 + length, 0, seconds)
        policy.stepped(1, bool(length), 1 + min(length, step % 7), seconds)
    return lengths


def seasoned(seed: int) -> DraftPolicy:
    """A policy after other requests: drafts that never stood, steps of their own times."""
    policy = DraftPolicy(2, ndraft=10)
    timing = random.Random(seed)
    for _ in range(3):
        policy.reset(0)
        for _ in range(100):
            length = policy.plan([Wish(0, 1000)], prefill=0, n_batch=2048).get(0, 0)
            if length:
                policy.verified(0, drafted=length, matched=0)
            seconds = timing.uniform(0.01, 0.05) * (1 + 0.5 * length)
            policy.decoded(1 + length, 0, seconds)
            policy.stepped(1, bool(length), 1, seconds)
    return policy


def test_a_reproducible_request_drafts_alike_whatever_ran_before_and_however_long_steps_took() -> (
    None
):
    runs = [
        drafts_of_one_request(policy, reproducible=True, seed=seed)
        for seed, policy in enumerate([DraftPolicy(2, ndraft=10), seasoned(1), seasoned(2)])
    ]
    assert runs[0] == runs[1] == runs[2]
    assert sum(runs[0]) > 100  # it drafts, from its first step
    assert runs[0][0] > 0
    # The measured policy drafts otherwise after other requests (what the rule above fixes).
    measured = [
        drafts_of_one_request(policy, reproducible=False, seed=seed)
        for seed, policy in enumerate([DraftPolicy(2, ndraft=10), seasoned(1)])
    ]
    assert measured[0] != measured[1]


def test_a_reproducible_request_beside_others_drafts_as_measured() -> None:
    """Other slots' rows change the batch anyway: with company, the measured policy decides
    (which drafts nothing before it has timed a decode)."""
    policy = DraftPolicy(2, ndraft=10)
    policy.reset(0, reproducible=True)
    policy.reset(1)
    assert policy.plan([Wish(0, 1000)], prefill=0, n_batch=2048) == {0: 1}
    assert policy.plan([Wish(0, 1000), Wish(1, 1000)], prefill=0, n_batch=2048) == {}
    assert policy.plan([Wish(0, 1000)], prefill=100, n_batch=2048) == {}


# ---- the server: the default model on its defaults ---------------------------------------

FRUITS = (
    "apple, banana, cherry, damson, elderberry, fig, grape, honeydew, kiwi, lemon, mango, "
    "nectarine, orange, papaya, quince, raspberry"
)
MORE_FRUITS = (
    "strawberry, tangerine, ugli fruit, vanilla bean, watermelon, yuzu, apricot, blackberry, "
    "coconut, date, guava, jackfruit, lime, lychee, mulberry, olive, peach, pear, plum"
)
# Lists to repeat, which prompt lookup drafts: a short prompt, below cache_min_tokens (a repeat
# would take another slot), and one the cache keeps (a repeat would reuse all of it but its
# last token). The seed's answers repeat the list (with seed 1 one of them, sampled in another
# KV layout, no longer did, and no draft stood).
PROMPTS = {
    "short": f"Here is a list: {FRUITS}. Repeat the list exactly, twice.",
    "cached": f"Here is a list: {FRUITS}, {MORE_FRUITS}. Repeat the list exactly, twice.",
}
# What the server served before, unseeded: drafts that rarely stand, steps of their own times.
OTHER = "Write a short story about a robot who learns to paint."
RUNS = 4


@pytest.fixture
def fresh_server(tmp_path: Path, serve: Any) -> Iterator[str]:
    """A real server with nothing configured: the default model on its packaged settings
    (prompt lookup, the Incremental Message Cache, a KV stream per slot)."""
    with serve(create_app(ServerSettings(base_path=tmp_path))) as base_url:
        yield base_url


def chat(http: httpx.Client, content: str, **params: Any) -> dict[str, Any]:
    body = {"model": DEFAULT_MODEL_ID, "messages": [{"role": "user", "content": content}]}
    answer = http.post("/v1/chat/completions", json=body | params)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


@pytest.mark.parametrize("prompt", list(PROMPTS))
@pytest.mark.parametrize(
    "sampling", [{"temperature": 0.8, "seed": 3}, {"temperature": 0}], ids=["seeded", "greedy"]
)
def test_identical_requests_on_an_idle_server_give_identical_answers(
    fresh_server: str, prompt: str, sampling: dict[str, Any]
) -> None:
    with httpx.Client(base_url=fresh_server, timeout=300) as http:
        for _ in range(4):
            chat(http, OTHER, max_tokens=64, temperature=1.0)
        answers = [chat(http, PROMPTS[prompt], max_tokens=64, **sampling) for _ in range(RUNS)]
    texts = [answer["choices"][0]["message"]["content"] for answer in answers]
    assert texts == [texts[0]] * RUNS
    for answer in answers:
        # Speculation was on, and its drafts stood.
        assert answer["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0
