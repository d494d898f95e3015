"""Sampling fast paths (greedy's argmax in place; the chain on a shortlist, greedy or drawn
behind top-k) must pick the token llama.cpp's full chain picks, step after step."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import llama_cpp
import numpy as np
import pytest

from kronk_core import ModelConfig
from kronk_core.contract.backend import Batch
from kronk_core.contract.sampling import (
    Distribution,
    Dry,
    Greedy,
    JsonSchemaGrammar,
    LogitBias,
    MinP,
    Penalties,
    SamplerStage,
    Temperature,
    TopK,
    TopP,
    Xtc,
)
from kronk_llamacpp.model import LlamaTextModel
from kronk_llamacpp.packaged import GEMMA_MODEL_ID, gemma_model_path
from kronk_llamacpp.sampler import (
    SHORTLIST_MAX_BIASES,
    GreedySampler,
    NativeSampler,
    ShortlistGreedySampler,
    ShortlistTopKSampler,
)

TEXT = (
    "The quick brown fox jumps over the lazy dog. In 1492 Columbus sailed the ocean blue; "
    "def add(a, b):\n    return a + b\n"
)


@pytest.fixture(scope="module")
def model() -> Iterator[LlamaTextModel]:
    config = ModelConfig.model_validate(
        {
            "id": GEMMA_MODEL_ID,
            "model_path": gemma_model_path(),
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


STORY = (
    "<start_of_turn>user\nList twenty fruits, one per line.<end_of_turn>\n<start_of_turn>model\n"
)
DRY = Dry(multiplier=1.05, base=1.75, allowed_length=2, penalty_last_n=0)
SEED = 1234


def side_by_side(
    model: LlamaTextModel, stages: list[SamplerStage], steps: int, **margins: object
) -> tuple[list[int], list[int], list[int], int]:
    """Tokens from the fast sampler and from llama.cpp's full chain (the same stages and
    seeds, fed the fast sampler's tokens), the argmax at each step, and how many steps the
    fast sampler had to run on the whole vocabulary. `margins` set its margin attribute."""
    fast = model.new_sampler(stages)
    reference = model.new_sampler(stages)
    assert isinstance(fast, ShortlistGreedySampler | ShortlistTopKSampler)
    for name, value in margins.items():
        setattr(fast, name, value)
    full_runs = 0
    whole = fast._sample_whole_vocabulary

    def counted(batch_index: int) -> int:
        nonlocal full_runs
        full_runs += 1
        return whole(batch_index)

    fast._sample_whole_vocabulary = counted  # type: ignore[method-assign]
    tokens = model.tokenize(STORY, add_special=True, parse_special=True)
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
        return picked, full_chain, argmax, full_runs
    finally:
        fast.close()
        reference.close()


# ---- greedy behind stages that lower logits ----------------------------------------


@pytest.mark.parametrize("looks", [ShortlistGreedySampler.LOOKS, 0])
@pytest.mark.parametrize("margin", [ShortlistGreedySampler.MARGIN, 0.0])
def test_greedy_behind_dry_and_penalties_picks_the_full_chains_token(
    model: LlamaTextModel, margin: float, looks: int
) -> None:
    """Over a long answer where DRY changes the pick: the fast sampler's pick is the full
    chain's at every step, from tokens tried one at a time (`looks`), the margin's
    shortlist or, with neither, the whole vocabulary, which then catches every case."""
    stages: list[SamplerStage] = [Penalties(64, 1.1, 0.0, 0.0), DRY, Greedy()]
    picked, full_chain, argmax, full_runs = side_by_side(
        model, stages, 160, MARGIN=margin, LOOKS=looks
    )
    assert picked == full_chain
    assert sum(p != a for p, a in zip(picked, argmax, strict=True)) >= 3  # penalties mattered
    if margin == 0.0 and looks == 0:
        assert full_runs > 0  # the penalties demoted the maximum: fallback taken and exact
    else:
        assert full_runs < 16  # the look or the shortlist decides nearly every step


@pytest.mark.parametrize(
    "penalties", [False, True], ids=["ban_on_the_top_tokens", "repeat_penalty"]
)
def test_tokens_tried_best_first_decide_most_steps(
    model: LlamaTextModel, monkeypatch: pytest.MonkeyPatch, penalties: bool
) -> None:
    """Before any shortlist, the tokens go through the chain one at a time, best first:
    a ban on the two tokens the unbiased answer picks most (as a ban on end tokens
    would be) or a repeat penalty demotes the maximum on many steps, and the next
    token or two decide them, seldom the margin's shortlist. Every pick is the full
    chain's, and the logits are left as they were (log-probs read them after)."""
    _, _, unbiased, _ = side_by_side(model, [DRY, Greedy()], 120)
    banned = sorted(set(unbiased), key=unbiased.count)[-2:]
    first: SamplerStage = (
        Penalties(64, 1.1, 0.0, 0.0) if penalties else LogitBias(tuple((t, -100.0) for t in banned))
    )
    scored: list[int] = []
    margin_picks: list[int] = []
    score, pick = ShortlistGreedySampler._score, ShortlistGreedySampler._pick

    def counted_score(sampler: ShortlistGreedySampler, token: int, logit: float) -> float:
        scored.append(token)
        return score(sampler, token, logit)

    def counted_pick(sampler: ShortlistGreedySampler, shortlist: np.ndarray, *rest: Any) -> Any:
        margin_picks.append(len(shortlist))
        return pick(sampler, shortlist, *rest)

    monkeypatch.setattr(ShortlistGreedySampler, "_score", counted_score)
    monkeypatch.setattr(ShortlistGreedySampler, "_pick", counted_pick)
    untouched = side_by_side(model, [DRY, Greedy()], 1)[2]
    picked, full_chain, argmax, full_runs = side_by_side(model, [first, DRY, Greedy()], 120)
    assert picked == full_chain
    demoted = sum(p != a for p, a in zip(picked, argmax, strict=True))
    assert demoted >= 3
    assert len(scored) > 120 + demoted  # a demoted step tried more than one token
    assert len(margin_picks) < 120 // 4
    if not penalties:
        assert not set(picked) & set(banned)
        assert not margin_picks and not full_runs
    # The first step again, unbiased: the logits the fast sampler set aside were restored.
    assert side_by_side(model, [DRY, Greedy()], 1)[2] == untouched


def lowering(model: LlamaTextModel, steps: int, bias: float) -> LogitBias:
    """A bias on every token the unbiased greedy answer of `steps` tokens picks."""
    _, _, argmax, _ = side_by_side(model, [DRY, Greedy()], steps)
    return LogitBias(tuple((token, bias) for token in sorted(set(argmax))))


def test_greedy_behind_a_negative_logit_bias_picks_the_full_chains_token(
    model: LlamaTextModel,
) -> None:
    """Biases that only lower logits keep the shortlist; what they push down (here every
    token the unbiased answer picks) is decided the same as on the whole vocabulary."""
    stages: list[SamplerStage] = [lowering(model, 60, -4.0), DRY, Greedy()]
    picked, full_chain, argmax, _ = side_by_side(model, stages, 60)
    assert picked == full_chain
    assert picked != argmax  # the bias changed the answer


def test_greedy_under_a_grammar_picks_the_full_chains_token(model: LlamaTextModel) -> None:
    schema = '{"type": "object", "properties": {"fruits": {"type": "array"}}}'
    stages: list[SamplerStage] = [JsonSchemaGrammar(schema), DRY, Greedy()]
    picked, full_chain, argmax, _ = side_by_side(model, stages, 60)
    assert picked == full_chain
    assert picked != argmax  # the grammar overruled the model
    text = b"".join(model.token_bytes(token, special=False) for token in picked)
    assert text.lstrip().startswith(b"{")


@pytest.mark.parametrize(
    "raising",
    [Penalties(64, 1.0, -0.5, 0.0), LogitBias(((42, -1.0), (43, 0.5)))],
    ids=["rewarding_penalty", "positive_bias"],
)
def test_stages_that_can_raise_a_logit_run_the_full_chain(
    model: LlamaTextModel, raising: SamplerStage
) -> None:
    rewarding = model.new_sampler([raising, Greedy()])
    try:
        assert type(rewarding) is NativeSampler
    finally:
        rewarding.close()


# ---- random draws behind top-k ---------------------------------------------------


def chain(top_k: int, repeat: float = 1.1) -> list[SamplerStage]:
    """Kronk's default order, every stage on: penalties and DRY lower logits before top-k."""
    return [
        Penalties(64, repeat, 0.0, 0.0),
        DRY,
        TopK(top_k),
        TopP(0.95),
        MinP(0.01),
        Xtc(0.5, 0.1, 1, SEED),
        Temperature(1.5),
        Distribution(SEED),
    ]


@pytest.mark.parametrize(
    ("stages", "margins", "fallbacks"),
    [
        (chain(40), ShortlistTopKSampler.MARGINS, "rare"),
        (chain(8, repeat=3.0), (1.0, 3.0), "some"),
        (chain(40), (0.0,), "all"),
        ("negative_bias", ShortlistTopKSampler.MARGINS, "rare"),
    ],
    ids=["defaults", "penalties_push_below_the_floor", "no_margin", "negative_bias"],
)
def test_a_draw_behind_top_k_is_the_full_chains_draw(
    model: LlamaTextModel,
    stages: list[SamplerStage] | str,
    margins: tuple[float, ...],
    fallbacks: str,
) -> None:
    """Over a long hot answer, step for step: the same token as llama.cpp's whole chain,
    whether the shortlist decided or the whole vocabulary had to."""
    steps = 160
    if stages == "negative_bias":  # every token the greedy answer picks, lowered
        stages = [lowering(model, steps, -3.0), *chain(40)]
    assert not isinstance(stages, str)
    drawn, full_chain, argmax, full_runs = side_by_side(model, stages, steps, MARGINS=margins)
    assert drawn == full_chain
    assert sum(d != a for d, a in zip(drawn, argmax, strict=True)) >= 10  # really drawn
    if fallbacks == "rare":
        assert full_runs < steps // 10
    elif fallbacks == "some":
        assert 0 < full_runs < steps
    else:
        assert full_runs == steps


def test_a_draw_under_a_grammar_is_the_full_chains_draw(model: LlamaTextModel) -> None:
    schema = '{"type": "object", "properties": {"fruits": {"type": "array"}}}'
    stages = [JsonSchemaGrammar(schema), *chain(40)]
    drawn, full_chain, _, _ = side_by_side(model, stages, 60)
    assert drawn == full_chain
    text = b"".join(model.token_bytes(token, special=False) for token in drawn)
    assert text.lstrip().startswith(b"{")


@pytest.mark.parametrize(
    "stages",
    [
        [TopP(0.9), TopK(40), Temperature(0.8), Distribution(SEED)],
        [Penalties(64, 1.0, -0.5, 0.0), TopK(40), Temperature(0.8), Distribution(SEED)],
        [TopK(0), Temperature(0.8), Distribution(SEED)],
    ],
    ids=["top_p_first", "rewarding_penalty", "top_k_off"],
)
def test_chains_the_shortlist_cannot_decide_run_whole(
    model: LlamaTextModel, stages: list[SamplerStage]
) -> None:
    sampler = model.new_sampler(stages)
    try:
        assert type(sampler) is NativeSampler
    finally:
        sampler.close()


@pytest.mark.parametrize("stages", [[DRY, Greedy()], chain(40)], ids=["greedy", "top_k"])
def test_more_biases_than_a_shortlist_searches_cheaply_run_the_full_chain(
    model: LlamaTextModel, stages: list[SamplerStage]
) -> None:
    many = LogitBias(tuple((token, -1.0) for token in range(SHORTLIST_MAX_BIASES + 1)))
    sampler = model.new_sampler([many, *stages])
    try:
        assert type(sampler) is NativeSampler
    finally:
        sampler.close()
