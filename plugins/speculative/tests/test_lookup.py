"""Prompt lookup's n-gram index, and the speculative section's settings (no model needed)."""

from __future__ import annotations

import random

import pytest

from kronk_core.contract.drafts import DraftRequest
from kronk_core.contract.errors import ConfigError
from kronk_core.contract.types import SamplingParams
from kronk_core.settings.config import ModelConfig
from kronk_speculative.lookup import NgramIndex, PromptLookup
from kronk_speculative.settings import SETTINGS


def index_of(tokens: list[int], ngram_min: int = 2, ngram_max: int = 4) -> NgramIndex:
    index = NgramIndex(ngram_min, ngram_max)
    index.extend(tokens)
    return index


def test_the_continuation_of_an_earlier_occurrence_is_proposed() -> None:
    # "def f ( x ) : return x" ... then "def f (" again.
    tokens = [1, 2, 3, 4, 5, 6, 7, 4, 9, 1, 2, 3]
    assert index_of(tokens).continuation(5) == [4, 5, 6, 7, 4]


def test_the_longest_matching_ngram_wins_over_a_later_shorter_one() -> None:
    tokens = [1, 2, 3, 10, 11, 8, 2, 3, 20, 21, 1, 2, 3]
    # [2, 3] last occurred before 20, but [1, 2, 3] (longer) before 10.
    assert index_of(tokens).continuation(2) == [10, 11]


def test_the_latest_occurrence_of_an_ngram_wins() -> None:
    tokens = [5, 6, 1, 5, 6, 2, 5, 6]
    assert index_of(tokens).continuation(1) == [2]


def test_nothing_is_proposed_without_an_earlier_occurrence() -> None:
    assert index_of([1, 2, 3, 4, 5]).continuation(4) == []
    assert index_of([7, 7]).continuation(3) == []  # [7] alone is shorter than ngram_min
    assert index_of([7, 7], ngram_min=1).continuation(3) == [7]


def test_a_continuation_stops_at_the_end_of_the_context() -> None:
    assert index_of([1, 2, 3, 1, 2]).continuation(10) == [3, 1, 2]


def request(slot: int, context: list[int], count: int = 4) -> DraftRequest:
    return DraftRequest(slot, context, count, SamplingParams(temperature=0.0), random.Random(0))


def test_each_slot_keeps_its_own_index_and_rebuilds_on_another_context() -> None:
    lookup = PromptLookup(ndraft=8, ngram_min=2, ngram_max=3)
    first, other = [1, 2, 3, 4, 1, 2], [9, 8, 7, 9, 8]
    assert [d.tokens for d in lookup.propose([request(0, first), request(1, other)])] == [
        (3, 4, 1, 2),
        (7, 9, 8),
    ]
    # The slot's context grew by what was accepted: the index follows it.
    assert lookup.propose([request(0, [*first, 3, 4, 5, 3, 4])])[0].tokens == (5, 3, 4)
    # Another conversation in the slot (IMC cut it back): nothing of the old one is proposed.
    assert lookup.propose([request(0, [1, 2, 6, 6])])[0].tokens == ()
    assert lookup.propose([request(0, [1, 2, 6, 6, 1, 2], 2)])[0].tokens == (6, 6)


def section(**values: object) -> object:
    config = ModelConfig.model_validate({"id": "m", "speculative": values})
    return SETTINGS.of(config)


def test_the_manuals_draft_model_keys_are_accepted() -> None:
    settings = section(**{"model-id": "small", "ndraft": 6, "ngpu-layers": -1, "device": "CPU"})
    assert (settings.model_id, settings.ndraft, settings.n_gpu_layers, settings.device) == (
        "small",
        6,
        -1,
        "CPU",
    )


@pytest.mark.parametrize(
    ("values", "key", "message"),
    [
        ({"ndraft": 0}, "ndraft", "greater than or equal to 1"),
        ({"ndraft": 33}, "ndraft", "less than or equal to 32"),
        ({"ngpu-layers": -2}, "ngpu-layers", "greater than or equal to -1"),
        ({"ngram_min": 5, "ngram_max": 3}, "", "ngram_min (5) must not exceed ngram_max (3)"),
        ({"draft_tokens": 4}, "draft_tokens", "Extra inputs are not permitted"),
    ],
)
def test_bad_settings_name_their_key(values: dict[str, object], key: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        section(**values)
    assert raised.value.key == f"models.m.speculative{f'.{key}' if key else ''}"
    assert message in raised.value.message
