"""Default sampler chain, in llama.cpp's customary order.

logit bias → constraints (grammar) → penalties → DRY → top-k → typical-p → top-p → min-p →
XTC → temperature → selection (greedy, distribution or adaptive-p).

With Mirostat on, as in llama-server, Mirostat replaces the truncation stages and the
selection: logit bias → constraints → penalties → DRY → temperature → Mirostat v1 or v2.
"""

from __future__ import annotations

from kronk_core import hookimpl
from kronk_core.contract import (
    RANDOM_SEED,
    AdaptiveP,
    Distribution,
    Dry,
    Grammar,
    Greedy,
    JsonSchemaGrammar,
    LogitBias,
    ModelInfo,
    Penalties,
    SamplerStage,
    SamplingParams,
    StructuredGrammar,
    Temperature,
    Xtc,
    mirostat_stage,
    truncation_stages,
)


def default_stages(params: SamplingParams) -> list[SamplerStage]:
    seed = RANDOM_SEED if params.seed is None else params.seed & 0xFFFFFFFF
    stages: list[SamplerStage] = []
    if params.logit_bias:
        stages.append(LogitBias(params.logit_bias))
    if params.grammar:
        stages.append(Grammar(params.grammar))
    elif params.json_schema:
        stages.append(JsonSchemaGrammar(params.json_schema))
    elif params.structured is not None:
        stages.append(StructuredGrammar(params.structured))
    if (
        params.repeat_penalty != 1.0
        or params.frequency_penalty != 0.0
        or params.presence_penalty != 0.0
    ):
        stages.append(
            Penalties(
                last_n=params.repeat_last_n,
                repeat=params.repeat_penalty,
                frequency=params.frequency_penalty,
                presence=params.presence_penalty,
            )
        )
    if params.dry_multiplier > 0.0:
        stages.append(
            Dry(
                multiplier=params.dry_multiplier,
                base=params.dry_base,
                allowed_length=params.dry_allowed_length,
                penalty_last_n=params.dry_penalty_last_n,
            )
        )
    mirostat = mirostat_stage(params, seed)
    if mirostat is not None:
        return [*stages, Temperature(params.temperature), mirostat]
    if params.greedy:
        stages.append(Greedy())
        return stages
    stages += truncation_stages(params)
    if params.xtc_probability > 0.0:
        stages.append(Xtc(params.xtc_probability, params.xtc_threshold, params.xtc_min_keep, seed))
    stages.append(Temperature(params.temperature))
    if params.adaptive_p_target > 0.0:
        stages.append(AdaptiveP(params.adaptive_p_target, params.adaptive_p_decay, seed))
    else:
        stages.append(Distribution(seed))
    return stages


@hookimpl(trylast=True)
def kronk_sampler_stages(params: SamplingParams, model_info: ModelInfo) -> list[SamplerStage]:
    return default_stages(params)
