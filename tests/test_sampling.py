"""Sampling: grammars, seeds, precedence, the default stage order, native samplers, bad values."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from kronk_core import FinishReason, Kronk, SamplingConfig
from kronk_core.errors import InvalidRequestError, KronkError
from kronk_core.sampling import (
    RANDOM_SEED,
    AdaptiveP,
    Distribution,
    Dry,
    Grammar,
    Greedy,
    JsonSchemaGrammar,
    MinP,
    Penalties,
    Temperature,
    TopK,
    TopP,
    Xtc,
    resolve_sampling,
)
from kronk_core.types import SamplingParams
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


# ---- native samplers -------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        {"xtc_probability": 0.5},
        {"adaptive_p_target": 0.5, "adaptive_p_decay": 0.9},
        {"repeat_penalty": 1.3, "frequency_penalty": 0.5, "presence_penalty": 0.5},
        {"min_p": 0.1},
    ],
    ids=["xtc", "adaptive_p", "penalties", "min_p"],
)
async def test_each_sampler_runs_natively(kronk: Kronk, params: dict[str, Any]) -> None:
    result = await kronk.chat(user("Tell me a story."), max_tokens=8, seed=7, **params)
    assert result.finish_reason is FinishReason.length
    assert result.usage.completion_tokens == 8
    assert result.content
    again = await kronk.chat(user("Tell me a story."), max_tokens=8, seed=7, **params)
    assert again.content == result.content  # seeded: the native chain is deterministic


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
