"""The manual's grammar presets (§9.5) compile on llama.cpp and hold the default model to
their shapes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from kronk_core import Kronk, KronkConfig, grammar_presets
from kronk_core.contract.types import FinishReason

SHAPES = {
    "GrammarJSON": (lambda text: isinstance(json.loads(text), (dict, list))),
    "GrammarJSONObject": (lambda text: isinstance(json.loads(text), dict)),
    "GrammarJSONArray": (lambda text: isinstance(json.loads(text), list)),
    "GrammarBoolean": (lambda text: text in ("true", "false")),
    "GrammarYesNo": (lambda text: text in ("yes", "no")),
    "GrammarInteger": (lambda text: re.fullmatch(r"-?(0|[1-9][0-9]*)", text) is not None),
    "GrammarNumber": (lambda text: isinstance(json.loads(text), (int, float))),
}
# A model this small rambles on inside an open JSON value: the questions spell the answer out.
QUESTIONS = {
    "GrammarJSON": 'Reply with the JSON object {"ok": true} and nothing else.',
    "GrammarJSONObject": 'Reply with the JSON object {"name": "Ann", "age": 30} and nothing else.',
    "GrammarJSONArray": 'Reply with the JSON array ["red", "green", "blue"] and nothing else.',
    "GrammarBoolean": "Is the sky blue? Answer true or false.",
    "GrammarYesNo": "Is water wet? Answer yes or no.",
    "GrammarInteger": "How many legs does a dog have?",
    "GrammarNumber": "What is pi to two decimals?",
}


@pytest.fixture(scope="module")
def kronk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kronk]:
    with Kronk(KronkConfig(base_path=tmp_path_factory.mktemp("kronk"))) as instance:
        yield instance


def test_every_manual_preset_is_there() -> None:
    assert set(grammar_presets.PRESETS) == set(SHAPES)
    assert grammar_presets.PRESETS["GrammarJSONObject"] is grammar_presets.JSON_OBJECT


@pytest.mark.parametrize("name", list(SHAPES))
async def test_a_preset_holds_the_answer_to_its_shape(kronk: Kronk, name: str) -> None:
    result = await kronk.chat(
        [{"role": "user", "content": QUESTIONS[name]}],
        grammar=grammar_presets.PRESETS[name],
        max_tokens=160,
        temperature=0,
    )
    assert result.finish_reason is FinishReason.stop, result.content
    assert SHAPES[name](result.content), result.content
