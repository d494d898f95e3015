"""Sampler stages: backend-neutral descriptions of a sampler chain.

A plugin's `kronk_sampler_stages` hook returns an ordered list of these; the
backend turns the list into its native chain. The last stage must select a
token (`Greedy`, `Distribution`, `AdaptiveP`, `Mirostat` or `MirostatV2`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING

from kronk_core.contract.types import SamplingParams, StructuredOutput

if TYPE_CHECKING:
    from kronk_core.settings.config import SamplingConfig


@dataclass(frozen=True, slots=True)
class LogitBias:
    """Adds each (token id, bias) pair's bias to that token's logit."""

    biases: tuple[tuple[int, float], ...]


@dataclass(frozen=True, slots=True)
class Grammar:
    gbnf: str
    root: str = "root"


@dataclass(frozen=True, slots=True)
class JsonSchemaGrammar:
    """Constrain output to JSON matching this schema (JSON text); the backend compiles it."""

    schema: str


@dataclass(frozen=True, slots=True)
class StructuredGrammar:
    """Constrain output to a StructuredOutput (JSON pieces between literal markup)."""

    output: StructuredOutput


@dataclass(frozen=True, slots=True)
class CompiledGrammar:
    """A grammar stage its backend compiled before the request was queued
    (`TextModel.compile_stages`), so that the engine thread only copies it.

    `native` is the backend's own compiled form; `source` is what it was compiled from.
    """

    source: Grammar | JsonSchemaGrammar | StructuredGrammar
    native: object = field(compare=False)


# The stages a backend compiles: TextModel.compile_stages turns them into CompiledGrammar.
GRAMMAR_STAGES = (Grammar, JsonSchemaGrammar, StructuredGrammar)


@dataclass(frozen=True, slots=True)
class Penalties:
    last_n: int
    repeat: float
    frequency: float
    presence: float


@dataclass(frozen=True, slots=True)
class Dry:
    multiplier: float
    base: float
    allowed_length: int
    penalty_last_n: int
    sequence_breakers: tuple[str, ...] = ("\n", ":", '"', "*")


@dataclass(frozen=True, slots=True)
class TopK:
    k: int


@dataclass(frozen=True, slots=True)
class TypicalP:
    """Locally typical sampling: keep the tokens whose surprise is nearest the distribution's
    entropy, up to probability mass `p`."""

    p: float
    min_keep: int = 1


@dataclass(frozen=True, slots=True)
class TopP:
    p: float
    min_keep: int = 1


@dataclass(frozen=True, slots=True)
class MinP:
    p: float
    min_keep: int = 1


@dataclass(frozen=True, slots=True)
class Xtc:
    probability: float
    threshold: float
    min_keep: int
    seed: int


@dataclass(frozen=True, slots=True)
class Temperature:
    value: float


@dataclass(frozen=True, slots=True)
class Greedy:
    pass


@dataclass(frozen=True, slots=True)
class Distribution:
    seed: int


@dataclass(frozen=True, slots=True)
class AdaptiveP:
    target: float
    decay: float
    seed: int


@dataclass(frozen=True, slots=True)
class Mirostat:
    """Mirostat v1 (Basu et al., 2021): picks a token so that the answer's surprise stays
    near `tau` (its perplexity near e**tau), learning at rate `eta`; it estimates the
    distribution's shape from its `m` most likely tokens."""

    tau: float
    eta: float
    seed: int
    m: int = 100


@dataclass(frozen=True, slots=True)
class MirostatV2:
    """Mirostat v2: picks among the tokens whose surprise is below a bound that it moves
    after each pick, so that the answer's surprise stays near `tau`."""

    tau: float
    eta: float
    seed: int


SamplerStage = (
    LogitBias
    | Grammar
    | JsonSchemaGrammar
    | StructuredGrammar
    | CompiledGrammar
    | Penalties
    | Dry
    | TopK
    | TypicalP
    | TopP
    | MinP
    | Xtc
    | Temperature
    | Greedy
    | Distribution
    | AdaptiveP
    | Mirostat
    | MirostatV2
)

SELECTING_STAGES = (Greedy, Distribution, AdaptiveP, Mirostat, MirostatV2)
# The stages that draw random numbers, each from its own `seed`.
SEEDED_STAGES = (Xtc, Distribution, AdaptiveP, Mirostat, MirostatV2)

# llama.cpp's "pick a random seed" value.
RANDOM_SEED = 0xFFFFFFFF


def truncation_stages(params: SamplingParams) -> list[SamplerStage]:
    """The stages that cut the candidates down: top-k, typical-p, top-p, min-p, where set
    (llama.cpp's order)."""
    keep = max(1, params.min_keep)
    stages: list[SamplerStage] = []
    if params.top_k > 0:
        stages.append(TopK(params.top_k))
    if params.typical_p < 1.0:
        stages.append(TypicalP(params.typical_p, keep))
    if params.top_p < 1.0:
        stages.append(TopP(params.top_p, keep))
    if params.min_p > 0.0:
        stages.append(MinP(params.min_p, keep))
    return stages


def mirostat_stage(params: SamplingParams, seed: int) -> Mirostat | MirostatV2 | None:
    """The Mirostat stage `params.mirostat` asks for (1 or 2), None when it is off."""
    if params.mirostat == 1:
        return Mirostat(params.mirostat_tau, params.mirostat_eta, seed)
    if params.mirostat == 2:
        return MirostatV2(params.mirostat_tau, params.mirostat_eta, seed)
    return None


def reseeded(stages: Sequence[SamplerStage], offset: int) -> list[SamplerStage]:
    """The stages with every seed moved by `offset` (modulo 2**32), the random one (llama.cpp
    picks it) left as it is: choice i of a seeded request draws with seed + i."""
    moved: list[SamplerStage] = []
    for stage in stages:
        if isinstance(stage, SEEDED_STAGES) and stage.seed != RANDOM_SEED:
            stage = replace(stage, seed=(stage.seed + offset) & 0xFFFFFFFF)
        moved.append(stage)
    return moved


def resolve_sampling(*layers: SamplingConfig | None) -> SamplingParams:
    """Merge sampling layers, highest precedence first (request, model config), over defaults."""
    values: dict[str, object] = {}
    names = {f.name for f in fields(SamplingParams)}
    for layer in reversed([layer for layer in layers if layer is not None]):
        for name, value in layer.model_dump(exclude_none=True).items():
            if name in names:
                values[name] = value
    return replace(SamplingParams(), **values)  # type: ignore[arg-type]
