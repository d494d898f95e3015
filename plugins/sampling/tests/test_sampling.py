"""Sampling: grammars, seeds, precedence, the default stage order, stage effects, bad values."""

from __future__ import annotations

import ctypes
import json
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema
import llama_cpp
import pytest

from kronk_core import FinishReason, Kronk, ModelConfig, SamplingConfig
from kronk_core.contract.errors import InvalidRequestError, KronkError
from kronk_core.contract.sampling import (
    RANDOM_SEED,
    AdaptiveP,
    Distribution,
    Dry,
    Grammar,
    Greedy,
    JsonSchemaGrammar,
    MinP,
    Mirostat,
    MirostatV2,
    Penalties,
    Temperature,
    TopK,
    TopP,
    TypicalP,
    Xtc,
    reseeded,
    resolve_sampling,
)
from kronk_core.contract.types import SamplingParams
from kronk_llamacpp.model import LlamaTextModel
from kronk_llamacpp.sampler import NativeSampler
from kronk_sampling.plugin import default_stages


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def text_of(kronk: Kronk, prompt: str, **params: Any) -> str:
    parts = [delta.content async for delta in kronk.chat_stream(user(prompt), **params)]
    return "".join(parts)


# ---- constrained output ----------------------------------------------------------------


async def test_gbnf_grammar_limits_output_to_alternatives(kronk: Kronk) -> None:
    result = await kronk.chat(
        user("Is the sky blue? Answer yes or no."),
        grammar='root ::= "yes" | "no"',
        temperature=0,
        max_tokens=60,
    )
    assert result.content in {"yes", "no"}
    assert result.finish_reason is FinishReason.stop
    assert result.usage.completion_tokens < 60


async def test_json_schema_output_validates(kronk: Kronk) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    result = await kronk.chat(
        user("Return JSON for a person called Alice who is 30 years old."),
        json_schema=json.dumps(schema),
        temperature=0,
        max_tokens=60,
    )
    assert result.finish_reason is FinishReason.stop
    value = json.loads(result.content)
    jsonschema.validate(value, schema)
    assert isinstance(value["name"], str)
    assert isinstance(value["age"], int)


# ---- seeds -----------------------------------------------------------------------------


async def test_seed_makes_random_sampling_reproducible(kronk: Kronk) -> None:
    params = {"temperature": 0.9, "max_tokens": 12}
    first = await text_of(kronk, "Hello", seed=42, **params)
    second = await text_of(kronk, "Hello", seed=42, **params)
    assert first == second
    others = [await text_of(kronk, "Hello", seed=seed, **params) for seed in (1, 2, 3)]
    assert any(other != first for other in others)


# ---- precedence (no model) -------------------------------------------------------------


def test_defaults_match_the_manual() -> None:
    params = resolve_sampling()
    assert params == SamplingParams()
    expected = {
        "temperature": 0.8,
        "top_k": 40,
        "top_p": 0.9,
        "min_p": 0.0,
        "repeat_penalty": 1.0,
        "repeat_last_n": 64,
        "dry_multiplier": 1.05,
        "dry_base": 1.75,
        "dry_allowed_length": 2,
        "dry_penalty_last_n": 0,
        "xtc_probability": 0.0,
        "xtc_threshold": 0.1,
        "xtc_min_keep": 1,
        "adaptive_p_target": 0.0,
        "adaptive_p_decay": 0.0,
        "typical_p": 1.0,
        "mirostat": 0,
        "mirostat_tau": 5.0,
        "mirostat_eta": 0.1,
        "min_keep": 0,
    }
    for name, value in expected.items():
        assert getattr(params, name) == value, name
    assert params.seed is None
    assert params.frequency_penalty == 0.0
    assert params.presence_penalty == 0.0
    assert params.grammar is None and params.json_schema is None


def test_request_beats_model_config_beats_defaults() -> None:
    request = SamplingConfig(temperature=0.2, seed=7)
    model = SamplingConfig(temperature=0.5, top_k=10, min_p=0.05, seed=3)
    params = resolve_sampling(request, model)
    assert params.temperature == 0.2  # request wins over model config
    assert params.seed == 7
    assert params.top_k == 10  # model config wins over defaults
    assert params.min_p == 0.05
    assert params.top_p == 0.9  # neither layer set it: default
    assert params.dry_multiplier == 1.05


def test_a_model_config_sets_typical_p_mirostat_and_min_keep_defaults() -> None:
    keys = {"typical_p": 0.5, "mirostat": 1, "mirostat_tau": 3.0, "mirostat_eta": 0.2}
    config = ModelConfig.model_validate({"sampling": {**keys, "min_keep": 2}})
    params = resolve_sampling(SamplingConfig(mirostat=2), config.sampling)
    assert (params.typical_p, params.mirostat, params.mirostat_tau) == (0.5, 2, 3.0)
    assert (params.mirostat_eta, params.min_keep) == (0.2, 2)
    with pytest.raises(ValueError, match=r"sampling\.mirostat"):
        ModelConfig.model_validate({"sampling": {"mirostat": 3}})


def test_unset_layers_are_skipped() -> None:
    model = SamplingConfig(top_p=0.5)
    assert resolve_sampling(None, model).top_p == 0.5
    assert resolve_sampling(SamplingConfig(), model).top_p == 0.5
    assert resolve_sampling(SamplingConfig(), None) == SamplingParams()
    # max_tokens is a sampling-config key but not a sampler value
    assert resolve_sampling(SamplingConfig(max_tokens=5)) == SamplingParams()


# ---- default stage order (no model) ----------------------------------------------------


def test_greedy_chain_ends_with_greedy() -> None:
    stages = default_stages(SamplingParams(temperature=0))
    assert stages == [Dry(1.05, 1.75, 2, 0), Greedy()]
    assert default_stages(SamplingParams(temperature=0, dry_multiplier=0)) == [Greedy()]
    # adaptive-p selects a token only on the random path; greedy ignores it
    assert default_stages(SamplingParams(temperature=0, adaptive_p_target=0.5))[-1] == Greedy()


def test_default_random_chain_order() -> None:
    stages = default_stages(SamplingParams(seed=5))
    assert stages == [
        Dry(1.05, 1.75, 2, 0),
        TopK(40),
        TopP(0.9),
        Temperature(0.8),
        Distribution(5),
    ]
    unseeded = default_stages(SamplingParams())
    assert unseeded[-1] == Distribution(RANDOM_SEED)


def test_full_chain_order_with_every_stage() -> None:
    params = SamplingParams(
        temperature=0.7,
        seed=9,
        grammar='root ::= "a"',
        repeat_penalty=1.1,
        frequency_penalty=0.2,
        min_p=0.05,
        xtc_probability=0.3,
        adaptive_p_target=0.4,
        adaptive_p_decay=0.8,
    )
    stages = default_stages(params)
    assert stages == [
        Grammar('root ::= "a"'),
        Penalties(last_n=64, repeat=1.1, frequency=0.2, presence=0.0),
        Dry(1.05, 1.75, 2, 0),
        TopK(40),
        TopP(0.9),
        MinP(0.05),
        Xtc(0.3, 0.1, 1, 9),
        Temperature(0.7),
        AdaptiveP(0.4, 0.8, 9),
    ]


def test_typical_p_sits_between_top_k_and_top_p_and_min_keep_reaches_the_truncations() -> None:
    stages = default_stages(SamplingParams(seed=5, typical_p=0.7, min_p=0.05, min_keep=3))
    assert stages == [
        Dry(1.05, 1.75, 2, 0),
        TopK(40),
        TypicalP(0.7, 3),
        TopP(0.9, 3),
        MinP(0.05, 3),
        Temperature(0.8),
        Distribution(5),
    ]
    # typical_p 1 is off; min_keep 0 and 1 both leave one token at least.
    assert not any(isinstance(s, TypicalP) for s in default_stages(SamplingParams()))
    assert TopP(0.9, 1) in default_stages(SamplingParams(min_keep=0))


@pytest.mark.parametrize(("version", "stage"), [(1, Mirostat), (2, MirostatV2)])
def test_mirostat_replaces_the_truncations_and_the_draw_as_llama_server_does(
    version: int, stage: type[Mirostat | MirostatV2]
) -> None:
    params = SamplingParams(
        seed=5,
        mirostat=version,
        mirostat_tau=3.0,
        mirostat_eta=0.2,
        typical_p=0.5,
        min_p=0.1,
        xtc_probability=0.5,
        adaptive_p_target=0.3,
        repeat_penalty=1.1,
        grammar='root ::= "a"',
    )
    assert default_stages(params) == [
        Grammar('root ::= "a"'),
        Penalties(last_n=64, repeat=1.1, frequency=0.0, presence=0.0),
        Dry(1.05, 1.75, 2, 0),
        Temperature(0.8),
        stage(3.0, 0.2, 5),
    ]
    # Sampled, never greedy, whatever the temperature.
    cold = SamplingParams(temperature=0, mirostat=version)
    assert not cold.greedy
    assert default_stages(cold)[-2:] == [Temperature(0), stage(5.0, 0.1, RANDOM_SEED)]


def test_reseeding_moves_every_seed_but_the_random_one() -> None:
    stages = default_stages(SamplingParams(seed=0xFFFFFFFE, xtc_probability=0.5))
    assert reseeded(stages, 3) == [  # modulo 2**32
        Dry(1.05, 1.75, 2, 0),
        TopK(40),
        TopP(0.9),
        Xtc(0.5, 0.1, 1, 1),
        Temperature(0.8),
        Distribution(1),
    ]
    unseeded = default_stages(SamplingParams(mirostat=2))
    assert reseeded(unseeded, 3) == unseeded


def test_xtc_included_only_when_enabled() -> None:
    assert not any(isinstance(s, Xtc) for s in default_stages(SamplingParams()))
    with_xtc = default_stages(SamplingParams(xtc_probability=0.5, seed=1))
    assert Xtc(0.5, 0.1, 1, 1) in with_xtc
    assert with_xtc.index(Xtc(0.5, 0.1, 1, 1)) < with_xtc.index(Temperature(0.8))


def test_grammar_stage_is_first() -> None:
    stages = default_stages(SamplingParams(temperature=0, json_schema='{"type": "object"}'))
    assert stages[0] == JsonSchemaGrammar('{"type": "object"}')
    stages = default_stages(SamplingParams(grammar="root ::= [a-z]+", repeat_penalty=1.2))
    assert stages[0] == Grammar("root ::= [a-z]+")
    assert isinstance(stages[1], Penalties)


def test_seed_is_masked_to_32_bits() -> None:
    stages = default_stages(SamplingParams(seed=-1))
    assert stages[-1] == Distribution(0xFFFFFFFF)
    stages = default_stages(SamplingParams(seed=(1 << 32) + 7))
    assert stages[-1] == Distribution(7)


# ---- each stage's effect, on llama.cpp's own samplers ----------------------------------
#
# The chain is the one a request gets: its sampling keys, the default stages (the sampling
# plugin), the llamacpp backend's native chain (llama.cpp's samplers). It runs on a
# hand-made candidate array (llama_sampler_apply needs no decode), and what each stage must
# leave is worked out here from the manual's and llama.cpp's definitions, never through the
# code under test. The keys not under test turn their stages off (top_k 0, top_p 1, DRY 0)
# or make them change nothing (temperature 1).

NEUTRAL: dict[str, Any] = {
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "dry_multiplier": 0.0,
    "seed": 1234,
}
NEWLINE = "\n"  # one of DRY's default sequence breakers
# Gemma's tokens for these words (each one token, with its leading space), and their logits
# in no particular order: llama.cpp sorts where a stage needs it.
LOGITS = {
    "fig": 1.0,
    "apple": 3.0,
    "kiwi": 0.0,
    "plum": 2.0,
    "grape": -2.0,
    "pear": 2.5,
    "date": -0.5,
    "lime": 0.5,
}


@pytest.fixture(scope="module")
def text_model(gemma_path: str) -> Iterator[LlamaTextModel]:
    config = ModelConfig.model_validate(
        {"model_path": gemma_path, "context_window": 256, "n_seq_max": 1}
    )
    model = LlamaTextModel(config)
    yield model
    model.close()


@dataclass
class Applied:
    """What a chain left: each remaining candidate's logit and probability, and its pick."""

    logits: dict[str, float]
    probs: dict[str, float]
    picked: str


class Chain:
    """The native sampler a request with these sampling keys gets, over the words above."""

    def __init__(self, model: LlamaTextModel, keys: dict[str, Any]) -> None:
        self.ids = {NEWLINE: model.tokenize(NEWLINE, add_special=False, parse_special=False)[0]}
        for word in LOGITS:
            [token] = model.tokenize(" " + word, add_special=False, parse_special=False)
            self.ids[word] = token
        self._words = {token: word for word, token in self.ids.items()}
        keys = {**NEUTRAL, **keys}
        if "logit_bias" in keys:
            keys["logit_bias"] = tuple((self.ids[w], bias) for w, bias in keys["logit_bias"])
        sampler = model.new_sampler(default_stages(SamplingParams(**keys)))
        assert isinstance(sampler, NativeSampler)
        self.sampler = sampler

    def accept(self, *words: str) -> None:
        for word in words:
            self.sampler.accept(self.ids[word])

    def apply(self, logits: Mapping[str, float] = LOGITS) -> Applied:
        array = (llama_cpp.llama_token_data * len(logits))(
            *(
                llama_cpp.llama_token_data(self.ids[word], logit, 0.0)
                for word, logit in logits.items()
            )
        )
        candidates = llama_cpp.llama_token_data_array(array, len(logits), -1, False)
        llama_cpp.llama_sampler_apply(self.sampler._chain, ctypes.byref(candidates))
        # Through the array's own pointer: XTC moves it past the tokens it cuts.
        left = [candidates.data[index] for index in range(candidates.size)]
        return Applied(
            {self._words[data.id]: data.logit for data in left},
            {self._words[data.id]: data.p for data in left},
            self._words[candidates.data[candidates.selected].id],
        )


@pytest.fixture
def chain(text_model: LlamaTextModel) -> Iterator[Callable[..., Chain]]:
    made: list[Chain] = []

    def make(**keys: Any) -> Chain:
        made.append(Chain(text_model, keys))
        return made[-1]

    yield make
    for each in made:
        each.sampler.close()


def softmax(logits: Mapping[str, float]) -> dict[str, float]:
    top = max(logits.values())
    weights = {word: math.exp(logit - top) for word, logit in logits.items()}
    total = sum(weights.values())
    return {word: weight / total for word, weight in weights.items()}


def most_likely_first(probs: Mapping[str, float]) -> list[str]:
    return sorted(probs, key=lambda word: -probs[word])


PROBS = softmax(LOGITS)  # apple .44, pear .27, plum .16, fig .059, lime .036, kiwi .022, ...


def test_top_k_keeps_the_k_most_likely(chain: Callable[..., Chain]) -> None:
    applied = chain(top_k=3).apply()
    assert applied.logits == pytest.approx(
        {word: LOGITS[word] for word in ("apple", "pear", "plum")}
    )


@pytest.mark.parametrize("top_p", [0.5, 0.8, 0.9])
def test_top_p_keeps_the_fewest_most_likely_tokens_that_reach_p(
    chain: Callable[..., Chain], top_p: float
) -> None:
    kept: list[str] = []
    for word in most_likely_first(PROBS):
        kept.append(word)
        if sum(PROBS[each] for each in kept) >= top_p:
            break
    applied = chain(top_p=top_p).apply()
    assert set(applied.logits) == set(kept)
    assert applied.probs == pytest.approx(softmax({word: LOGITS[word] for word in kept}))


@pytest.mark.parametrize("min_p", [0.1, 0.3, 0.5])
def test_min_p_drops_exactly_the_tokens_below_min_p_times_the_top_probability(
    chain: Callable[..., Chain], min_p: float
) -> None:
    kept = {word for word, p in PROBS.items() if p >= min_p * max(PROBS.values())}
    assert 1 < len(kept) < len(LOGITS)
    applied = chain(min_p=min_p).apply()
    assert applied.logits == pytest.approx({word: LOGITS[word] for word in kept})


def xtc_leaves(logits: Mapping[str, float], threshold: float, min_keep: int) -> set[str]:
    """XTC's cut, by hand: of the tokens at or above the threshold all but the least likely
    go, unless fewer than min_keep tokens would be left."""
    probs = softmax(logits)
    ranked = most_likely_first(probs)
    cut = [word for word in ranked if probs[word] >= threshold][:-1]
    return set(ranked) if len(ranked) - len(cut) < min_keep else set(ranked) - set(cut)


@pytest.mark.parametrize(
    ("logits", "threshold", "min_keep", "left"),
    [
        (LOGITS, 0.05, 1, 5),
        (LOGITS, 0.1, 1, 6),
        (LOGITS, 0.2, 1, 7),
        (LOGITS, 0.3, 1, 8),  # one token above the threshold: it stays
        (LOGITS, 0.1, 6, 6),
        (LOGITS, 0.1, 7, 8),  # the cut would leave fewer than min_keep
        ({"apple": 1.0, "pear": 0.0}, 0.1, 1, 1),  # every token above: the last one stays
    ],
)
def test_xtc_removes_the_top_choices_above_its_threshold(
    chain: Callable[..., Chain],
    logits: dict[str, float],
    threshold: float,
    min_keep: int,
    left: int,
) -> None:
    xtc = chain(xtc_probability=1.0, xtc_threshold=threshold, xtc_min_keep=min_keep)
    expected = xtc_leaves(logits, threshold, min_keep)
    assert len(expected) == left
    assert xtc.apply(logits).logits == pytest.approx({word: logits[word] for word in expected})


@pytest.mark.parametrize("probability", [0.3, 0.7])
def test_xtc_cuts_with_its_probability(chain: Callable[..., Chain], probability: float) -> None:
    xtc = chain(xtc_probability=probability, xtc_threshold=0.1)
    draws = 2000
    cut = sum("apple" not in xtc.apply().logits for _ in range(draws))
    # Seeded, so the count is the same every run; 4.5 standard deviations of a binomial.
    assert abs(cut / draws - probability) < 4.5 * math.sqrt(probability * (1 - probability) / draws)


def test_temperature_divides_the_logits_and_the_draw_takes_their_softmax(
    chain: Callable[..., Chain],
) -> None:
    applied = chain(temperature=0.5).apply()
    scaled = {word: logit / 0.5 for word, logit in LOGITS.items()}
    assert applied.logits == pytest.approx(scaled)
    assert applied.probs == pytest.approx(softmax(scaled))


def test_logit_bias_adds_each_bias(chain: Callable[..., Chain]) -> None:
    applied = chain(logit_bias=(("kiwi", 4.0), ("apple", -1.5))).apply()
    assert applied.logits == pytest.approx({**LOGITS, "kiwi": 4.0, "apple": 1.5})


HISTORY = ("date", "apple", "pear", "apple", "grape", "apple")


def penalised(
    window: Sequence[str], repeat: float, frequency: float, presence: float
) -> dict[str, float]:
    """llama.cpp's penalties, by hand: a token seen c times in the window has its logit
    divided by `repeat` (multiplied where it is not positive), then lowered by
    c × frequency + presence."""
    counts = Counter(window)
    logits = dict(LOGITS)
    for word, count in counts.items():
        logit = logits[word]
        logit = logit * repeat if logit <= 0 else logit / repeat
        logits[word] = logit - count * frequency - presence
    return logits


@pytest.mark.parametrize(
    ("last_n", "window", "apple"),
    [
        (4, HISTORY[-4:], 3.0 / 1.5 - 2 * 0.25 - 0.5),  # apple twice in the last 4
        (-1, HISTORY, 3.0 / 1.5 - 3 * 0.25 - 0.5),
        (0, (), 3.0),
    ],
    ids=["last_4", "whole_context", "off"],
)
def test_penalties_lower_the_repeated_tokens_logits(
    chain: Callable[..., Chain], last_n: int, window: tuple[str, ...], apple: float
) -> None:
    penalties = chain(
        repeat_penalty=1.5, frequency_penalty=0.25, presence_penalty=0.5, repeat_last_n=last_n
    )
    penalties.accept(*HISTORY)
    applied = penalties.apply()
    assert applied.logits == pytest.approx(penalised(window, 1.5, 0.25, 0.5))
    assert applied.logits["apple"] == pytest.approx(apple)


REPEATED = ("apple", "pear", "plum", "fig", "lime", "apple", "pear", "plum", "fig")


@pytest.mark.parametrize(
    ("history", "last_n", "penalty"),
    [
        # "apple pear plum fig" came before, followed by lime: lime would repeat 4 + 1 tokens.
        (REPEATED, 0, {"lime": 0.8 * 1.5 ** (4 - 2)}),
        # The last 5 tokens hold no earlier "fig": nothing repeats.
        (REPEATED, 5, {}),
        # A repeat reaches back to the last sequence breaker only: "plum fig", 2 tokens.
        (
            (
                "apple",
                "pear",
                NEWLINE,
                "plum",
                "fig",
                "lime",
                "apple",
                "pear",
                NEWLINE,
                "plum",
                "fig",
            ),
            0,
            {"lime": 0.8},
        ),
    ],
    ids=["whole_context", "last_5", "breaker"],
)
def test_dry_penalises_the_token_that_would_extend_a_repeat(
    chain: Callable[..., Chain], history: tuple[str, ...], last_n: int, penalty: dict[str, float]
) -> None:
    """DRY: a token that would make the last n tokens (n ≥ allowed_length) repeat once more
    loses multiplier × base^(n − allowed_length)."""
    dry = chain(dry_multiplier=0.8, dry_base=1.5, dry_allowed_length=2, dry_penalty_last_n=last_n)
    dry.accept(*history)
    expected = {word: logit - penalty.get(word, 0.0) for word, logit in LOGITS.items()}
    assert dry.apply().logits == pytest.approx(expected)


def typical_set(probs: Mapping[str, float], p: float, min_keep: int = 1) -> set[str]:
    """Locally typical sampling (Meister et al.; llama.cpp's typical sampler): the tokens
    whose surprise lies nearest the entropy, nearest first, until their mass passes p (and
    at least min_keep of them)."""
    entropy = -sum(q * math.log(q) for q in probs.values())
    nearest = sorted(probs, key=lambda word: abs(-math.log(probs[word]) - entropy))
    kept: list[str] = []
    for word in nearest:
        kept.append(word)
        if sum(probs[w] for w in kept) > p and len(kept) >= min_keep:
            break
    return set(kept)


@pytest.mark.parametrize("p", [0.3, 0.6, 0.9])
def test_typical_p_keeps_the_tokens_nearest_the_entropy(
    chain: Callable[..., Chain], p: float
) -> None:
    applied = chain(typical_p=p).apply()
    assert set(applied.logits) == typical_set(PROBS, p)
    if p == 0.3:  # the most likely token is less typical than the next two: it goes
        assert set(applied.logits) == {"pear", "plum"}
    # What is left is drawn from in proportion to its probability.
    kept = {word: PROBS[word] for word in applied.logits}
    total = sum(kept.values())
    assert applied.probs == pytest.approx({w: q / total for w, q in kept.items()}, abs=1e-5)


def test_min_keep_holds_tokens_that_the_truncations_would_cut(
    chain: Callable[..., Chain],
) -> None:
    assert len(chain(typical_p=0.01).apply().logits) == 1
    assert set(chain(typical_p=0.01, min_keep=3).apply().logits) == typical_set(PROBS, 0.01, 3)
    assert len(chain(top_p=0.01).apply().logits) == 1
    top = chain(top_p=0.01, min_keep=3).apply()
    assert set(top.logits) == set(most_likely_first(PROBS)[:3])
    assert set(chain(min_p=0.9, min_keep=4).apply().logits) == set(most_likely_first(PROBS)[:4])


def surprise(probs: Mapping[str, float]) -> dict[str, float]:
    """Each token's surprise in bits, as Mirostat measures it."""
    return {word: -math.log2(p) for word, p in probs.items()}


def test_mirostat_v2_keeps_the_tokens_below_its_bound_and_moves_the_bound(
    chain: Callable[..., Chain],
) -> None:
    """Mirostat v2 (Basu et al., 2021, algorithm 2): the bound mu starts at 2·tau bits; the
    tokens whose surprise is above it go (top_k is not applied: Mirostat replaces it); after
    a draw, mu moves by eta times the draw's surprise (among the kept) less tau."""
    tau, eta = 2.5, 1.0
    sampler = chain(mirostat=2, mirostat_tau=tau, mirostat_eta=eta, top_k=2)
    first = sampler.apply()
    bound = 2 * tau
    assert set(first.logits) == {w for w, s in surprise(PROBS).items() if s <= bound}
    assert len(first.logits) == 5
    kept = {word: PROBS[word] for word in first.logits}
    renormalised = {word: p / sum(kept.values()) for word, p in kept.items()}
    bound -= eta * (surprise(renormalised)[first.picked] - tau)
    second = sampler.apply()
    assert set(second.logits) == {w for w, s in surprise(PROBS).items() if s <= bound}


def test_mirostat_v1_keeps_as_many_tokens_as_its_zipf_estimate_says(
    chain: Callable[..., Chain], text_model: LlamaTextModel
) -> None:
    """Mirostat v1 (Basu et al., 2021, algorithm 1): s, the Zipf exponent estimated from the
    most likely tokens' probability ratios, and mu = 2·tau give k, the tokens kept."""
    tau = 2.0
    ranked = sorted(PROBS.values(), reverse=True)
    pairs = [
        (math.log((i + 2) / (i + 1)), math.log(ranked[i] / ranked[i + 1]))
        for i in range(len(ranked) - 1)
    ]
    s = sum(t * b for t, b in pairs) / sum(t * t for t, _ in pairs)
    epsilon = s - 1
    k = (epsilon * 2 ** (2 * tau) / (1 - text_model.n_vocab ** (-epsilon))) ** (1 / s)
    assert 3.5 < k < 6  # more than top_k's 2, fewer than all 8
    applied = chain(mirostat=1, mirostat_tau=tau, top_k=2).apply()
    assert set(applied.logits) == set(most_likely_first(PROBS)[: int(k)])


def adapted(probs: Mapping[str, float], target: float) -> dict[str, float]:
    """adaptive-p's logits (llama.cpp PR 17927): 5 at the target probability, falling off
    quadratically near it and linearly far from it, distances in units of 0.3."""
    logits = {}
    for word, p in probs.items():
        distance = abs(p - target) / 0.3
        logits[word] = 5.0 - 10.0 * distance * distance / (1.0 + distance)
    return logits


def test_adaptive_p_favours_tokens_near_its_target_and_adapts(
    chain: Callable[..., Chain],
) -> None:
    target, decay = 0.25, 0.5
    sampler = chain(adaptive_p_target=target, adaptive_p_decay=decay)
    first = sampler.apply()
    assert first.logits == pytest.approx(adapted(PROBS, target), abs=1e-4)
    assert first.probs == pytest.approx(softmax(adapted(PROBS, target)), abs=1e-5)
    # pear (p = 0.27, the nearest to 0.25) is now the likeliest, not apple (0.44).
    assert most_likely_first(first.probs)[0] == "pear"
    # The picks' original probabilities, averaged with weights decay^age (the average starts
    # as if every earlier pick had been on target), steer the target: 2·target − average.
    sampler.accept(first.picked)
    weight = 1 / (1 - decay)
    average = (PROBS[first.picked] + decay * target * weight) / (1 + decay * weight)
    steered = min(max(2 * target - average, 0.0), 1.0)
    assert sampler.apply().logits == pytest.approx(adapted(PROBS, steered), abs=1e-4)


def test_adaptive_p_draws_mostly_near_its_target(chain: Callable[..., Chain]) -> None:
    sampler = chain(adaptive_p_target=0.25)
    picks = Counter(sampler.apply().picked for _ in range(1000))  # no accept: no steering
    assert most_likely_first(dict(picks))[0] == "pear"
    assert picks["pear"] > 2 * picks["apple"]


async def test_the_request_keys_reach_the_engines_chain(kronk: Kronk) -> None:
    """Through the engine, on the model's own distributions: min_p 1 keeps only the top
    token, so a hot seeded draw gives the greedy answer; XTC with threshold 0 behind top-k 2
    cuts the top token, so every token is the runner-up of the model's log-probs."""
    greedy = await kronk.chat(user("Tell me a story."), temperature=0, max_tokens=8)
    hot = await kronk.chat(
        user("Tell me a story."), temperature=1.5, seed=7, min_p=1.0, max_tokens=8
    )
    assert hot.content == greedy.content
    runner_up = await kronk.chat(
        user("Tell me a story."),
        temperature=1.0,
        seed=7,
        top_k=2,
        xtc_probability=1.0,
        xtc_threshold=0.0,
        dry_multiplier=0.0,
        max_tokens=8,
        logprobs=True,
        top_logprobs=2,
    )
    assert len(runner_up.logprobs) == 8
    for step in runner_up.logprobs:
        assert step.bytes == step.top_logprobs[1].bytes != step.top_logprobs[0].bytes


# ---- bad values ------------------------------------------------------------------------


def test_out_of_range_temperature_is_rejected(kronk: Kronk) -> None:
    with pytest.raises(InvalidRequestError) as info:
        kronk.chat_request(user("hi"), temperature=-1)
    assert info.value.param == "temperature"
    assert "temperature" in str(info.value)


def test_unknown_sampling_key_is_rejected(kronk: Kronk) -> None:
    with pytest.raises(InvalidRequestError) as info:
        kronk.chat_request(user("hi"), temprature=0.5)
    assert "temprature" in str(info.value)


def test_too_many_top_logprobs_is_rejected(kronk: Kronk) -> None:
    with pytest.raises(InvalidRequestError) as info:
        kronk.chat_request(user("hi"), top_logprobs=6)
    assert info.value.param == "top_logprobs"
    kronk.chat_request(user("hi"), top_logprobs=5)  # the limit itself is fine


async def test_invalid_grammar_fails_the_stream(kronk: Kronk) -> None:
    with pytest.raises(KronkError) as info:
        stream = await kronk.start_chat(
            kronk.chat_request(user("hi"), grammar="root ::= (", max_tokens=5)
        )
        async for _ in stream:
            pass
    assert "grammar" in str(info.value)
    # The engine is fine afterwards.
    ok = await kronk.chat(user("hi"), grammar='root ::= "ok"', temperature=0, max_tokens=5)
    assert ok.content == "ok"
