"""Sampler stages: backend-neutral descriptions of a sampler chain.

A plugin's `kronk_sampler_stages` hook returns an ordered list of these; the
backend turns the list into its native chain. The last stage must select a
token (`Greedy`, `Distribution` or `AdaptiveP`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from kronk_core.settings.config import SamplingConfig
from kronk_core.types import SamplingParams, StructuredOutput


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


SamplerStage = (
    LogitBias
    | Grammar
    | JsonSchemaGrammar
    | StructuredGrammar
    | CompiledGrammar
    | Penalties
    | Dry
    | TopK
    | TopP
    | MinP
    | Xtc
    | Temperature
    | Greedy
    | Distribution
    | AdaptiveP
)

SELECTING_STAGES = (Greedy, Distribution, AdaptiveP)

# llama.cpp's "pick a random seed" value.
RANDOM_SEED = 0xFFFFFFFF


def truncation_stages(params: SamplingParams) -> list[SamplerStage]:
    """The stages that cut the candidates down: top-k, top-p, min-p, where set."""
    stages: list[SamplerStage] = []
    if params.top_k > 0:
        stages.append(TopK(params.top_k))
    if params.top_p < 1.0:
        stages.append(TopP(params.top_p))
    if params.min_p > 0.0:
        stages.append(MinP(params.min_p))
    return stages


def resolve_sampling(*layers: SamplingConfig | None) -> SamplingParams:
    """Merge sampling layers, highest precedence first (request, model config), over defaults."""
    values: dict[str, object] = {}
    names = {f.name for f in fields(SamplingParams)}
    for layer in reversed([layer for layer in layers if layer is not None]):
        for name, value in layer.model_dump(exclude_none=True).items():
            if name in names:
                values[name] = value
    return replace(SamplingParams(), **values)  # type: ignore[arg-type]
