"""Greedy fast paths (the argmax in place; the chain on a shortlist) must pick the token
llama.cpp's full chain picks."""

from __future__ import annotations

from collections.abc import Iterator

import llama_cpp
import numpy as np
import pytest

from kronk_core import DEFAULT_MODEL_ID, ModelConfig
from kronk_core.backend import Batch
from kronk_core.models import default_model_path
from kronk_core.sampling import Dry, Greedy, JsonSchemaGrammar, Penalties, SamplerStage
from kronk_llamacpp.model import LlamaTextModel
from kronk_llamacpp.sampler import GreedySampler, NativeSampler, ShortlistGreedySampler

TEXT = (
    "The quick brown fox jumps over the lazy dog. In 1492 Columbus sailed the ocean blue; "
    "def add(a, b):\n    return a + b\n"
)


@pytest.fixture(scope="module")
def model() -> Iterator[LlamaTextModel]:
    config = ModelConfig.model_validate(
        {
            "id": DEFAULT_MODEL_ID,
            "model_path": default_model_path(),
            "context_window": 512,
            "n_seq_max": 1,
        }
    )
    loaded = LlamaTextModel(config)
    yield loaded
    loaded.close()


def test_greedy_alone_takes_the_fast_path_and_matches_llama_cpp_at_every_position(
    model: LlamaTextModel,
) -> None:
    tokens = model.tokenize(TEXT, add_special=True, parse_special=False)
    batch = Batch()
    for position, token in enumerate(tokens):
        batch.add(token, position, 0, True)
    model.decode(batch)
    fast = model.new_sampler([Greedy()])
    assert isinstance(fast, GreedySampler)
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    native = NativeSampler(model._ctx, chain, model.n_vocab)
    try:
        picked = [fast.sample(index) for index in range(len(tokens))]
        assert picked == [native.sample(index) for index in range(len(tokens))]
        assert len(set(picked)) > 5  # many different distributions, not one repeated case
    finally:
        native.close()
        fast.close()


class Recording(ShortlistGreedySampler):
    """Counts the steps that had to run the chain on the whole vocabulary."""

    full_runs = 0

    def _sample_whole_vocabulary(self, batch_index: int) -> int:
        self.full_runs += 1
        return super()._sample_whole_vocabulary(batch_index)


def generate_with_both(
    model: LlamaTextModel, stages: list[SamplerStage], prompt: str, steps: int, margin: float
) -> tuple[list[int], list[int], list[int], int]:
    """Greedy tokens from the shortlist sampler, llama.cpp's full chain (the same stages,
    fed the shortlist's tokens) and plain argmax, step by step; and the full-vocabulary runs."""
    fast = model.new_sampler(stages)
    reference = model.new_sampler(stages)
    assert isinstance(fast, ShortlistGreedySampler)
    fast.__class__ = Recording
    fast.MARGIN = margin
    tokens = model.tokenize(prompt, add_special=True, parse_special=True)
    picked: list[int] = []
    full_chain: list[int] = []
    argmax: list[int] = []
    model.seq_remove(0, 0, -1)
    try:
        position = 0
        for _ in range(steps):
            batch = Batch()
            for offset, token in enumerate(tokens):
                batch.add(token, position + offset, 0, offset == len(tokens) - 1)
            model.decode(batch)
            position += len(tokens)
            row = len(tokens) - 1
            logits = llama_cpp.llama_get_logits_ith(model._ctx, row)
            argmax.append(int(np.ctypeslib.as_array(logits, shape=(model.n_vocab,)).argmax()))
            full_chain.append(NativeSampler.sample(reference, row))
            picked.append(fast.sample(row))
            tokens = [picked[-1]]
        assert isinstance(fast, Recording)
        return picked, full_chain, argmax, fast.full_runs
    finally:
        fast.close()
        reference.close()


STORY = (
    "<start_of_turn>user\nList twenty fruits, one per line.<end_of_turn>\n"
    "<start_of_turn>model\n"
)
DRY = Dry(multiplier=1.05, base=1.75, allowed_length=2, penalty_last_n=0)


@pytest.mark.parametrize("margin", [ShortlistGreedySampler.MARGIN, 0.0])
def test_greedy_behind_dry_and_penalties_picks_the_full_chains_token(
    model: LlamaTextModel, margin: float
) -> None:
    """Over a long answer where DRY changes the pick: the shortlist's pick is the full chain's
    at every step; with no margin at all the whole-vocabulary run catches every case."""
    stages: list[SamplerStage] = [Penalties(64, 1.1, 0.0, 0.0), DRY, Greedy()]
    picked, full_chain, argmax, full_runs = generate_with_both(model, stages, STORY, 160, margin)
    assert picked == full_chain
    assert sum(p != a for p, a in zip(picked, argmax, strict=True)) >= 3  # penalties mattered
    if margin == 0.0:
        assert full_runs > 0  # the penalties demoted the maximum: fallback taken and exact
    else:
        assert full_runs < 16  # the shortlist decides nearly every step


def test_greedy_under_a_grammar_picks_the_full_chains_token(model: LlamaTextModel) -> None:
    schema = '{"type": "object", "properties": {"fruits": {"type": "array"}}}'
    stages: list[SamplerStage] = [JsonSchemaGrammar(schema), DRY, Greedy()]
    picked, full_chain, argmax, _ = generate_with_both(
        model, stages, STORY, 60, ShortlistGreedySampler.MARGIN
    )
    assert picked == full_chain
    assert picked != argmax  # the grammar overruled the model
    text = b"".join(model.token_bytes(token, special=False) for token in picked)
    assert text.lstrip().startswith(b"{")


def test_stages_that_can_raise_a_logit_run_the_full_chain(model: LlamaTextModel) -> None:
    rewarding = model.new_sampler([Penalties(64, 1.0, -0.5, 0.0), Greedy()])
    try:
        assert type(rewarding) is NativeSampler
    finally:
        rewarding.close()
