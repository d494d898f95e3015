"""What the engine runs and what it reports: a generation request, its text, its end."""

from __future__ import annotations

from dataclasses import dataclass

from kronk_core.contract.errors import KronkError
from kronk_core.contract.media import MediaSpan
from kronk_core.contract.records import RequestRecord
from kronk_core.contract.sampling import SamplerStage
from kronk_core.contract.types import (
    DEFAULT_MAX_TOKENS,
    Adapters,
    FinishReason,
    SamplingParams,
    TokenLogprob,
    Usage,
)


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What the engine runs: tokens in, sampling settings, stop conditions."""

    prompt_tokens: tuple[int, ...]
    sampling: SamplingParams
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = ()
    # Text and tokens that end generation as the model's own end-of-turn does (its config's
    # `stop`; the chat template's turn opener): a natural end, not a stop sequence.
    end_strings: tuple[str, ...] = ()
    end_tokens: frozenset[int] = frozenset()
    logprobs: bool = False
    top_logprobs: int = 0
    # How many leading prompt tokens are the system prompt (0: none or not computed).
    system_tokens: int = 0
    # Render control tokens (Harmony's <|channel|>, [TOOL_CALLS]) as text for the output parser.
    special_tokens_as_text: bool = False
    # The sampler stages, grammars compiled, when the SDK prepared them ahead of the engine
    # (`TextModel.compile_stages`); None: the engine asks the sampler-stage hook.
    stages: tuple[SamplerStage, ...] | None = None
    # Media chunks in the prompt, in order; their positions hold pseudo-tokens.
    media: tuple[MediaSpan, ...] = ()
    # Context shift: when the window fills, keep this many leading tokens, drop half of the
    # rest and go on. None: the generation ends there with `length`.
    shift_keep: int | None = None
    # The LoRA adapters its decodes apply: part of what its KV holds, so a cached prefix is
    # reused only under the same adapters, and a step decodes one adapter set.
    adapters: Adapters = ()


@dataclass(frozen=True, slots=True)
class TextChunk:
    """Newly generated text (complete UTF-8, stop strings already cut) and its tokens' logprobs."""

    text: str
    token_count: int
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class Finished:
    """The last event of a generation."""

    reason: FinishReason
    usage: Usage
    error: KronkError | None = None
    # The stop string that ended generation (None: end of generation token, length, ...).
    stop_sequence: str | None = None
    # How the engine ran it (None: cancelled or failed before it reached a slot).
    record: RequestRecord | None = None


EngineEvent = TextChunk | Finished
