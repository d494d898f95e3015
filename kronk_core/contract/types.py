"""Plain dataclasses that travel inside Kronk, from a dialect to the engine and back."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

from kronk_core.contract.media import Media

if TYPE_CHECKING:
    from kronk_core.settings.config import SamplingConfig

Role = Literal["system", "developer", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a tool call while the model writes it.

    A call's first piece carries its `name`; every piece may carry the next
    fragment of its `arguments`. Once the call is complete it arrives whole in
    ChatDelta.tool_calls, and its `arguments` are its pieces' fragments joined.
    """

    id: str
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Role
    content: str | None = None
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    # Images and sounds, in the order of the MEDIA_MARKERs in `content`.
    media: tuple[Media, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function the model may call; `parameters_json` is its JSON schema as text."""

    name: str
    description: str = ""
    parameters_json: str = "{}"


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """Whether the model may (auto), must (required) or must not (none) call a tool.

    `function` forces a call of the one tool named `name`.
    """

    mode: Literal["auto", "none", "required", "function"] = "auto"
    name: str | None = None


@dataclass(frozen=True, slots=True)
class JsonSegment:
    """Literal `prefix`, then a JSON value matching `schema` (JSON text), then literal `suffix`."""

    schema: str
    prefix: str = ""
    suffix: str = ""


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """Output made of one of `choices`; with `repeat`, one or more of them in a row.

    Template processors describe forced tool calls this way; the backend
    compiles it into its grammar.
    """

    choices: tuple[JsonSegment, ...]
    repeat: bool = False


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Fully resolved sampling values for one request (no "unset" left)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.0
    seed: int | None = None
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    dry_multiplier: float = 1.05
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    xtc_min_keep: int = 1
    adaptive_p_target: float = 0.0
    adaptive_p_decay: float = 0.0
    typical_p: float = 1.0
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    # The fewest tokens top-p, min-p and typical-p leave (0 and 1 alike: one at least).
    min_keep: int = 0
    grammar: str | None = None
    json_schema: str | None = None
    structured: StructuredOutput | None = None
    # (token id, bias) pairs added to those tokens' logits before every other stage.
    logit_bias: tuple[tuple[int, float], ...] = ()

    @property
    def greedy(self) -> bool:
        # Mirostat picks by its own rule at any temperature: it is never plain greedy.
        return self.temperature <= 0.0 and not self.mirostat

    @property
    def reproducible(self) -> bool:
        """Whether the same request must give the same answer: greedy, or seeded."""
        return self.greedy or self.seed is not None


DEFAULT_MAX_TOKENS = 4096


@dataclass(frozen=True, slots=True)
class TokenDistribution:
    """Probabilities over some tokens; every token not listed has probability 0."""

    tokens: tuple[int, ...]
    probs: tuple[float, ...]

    def prob(self, token: int) -> float:
        try:
            return self.probs[self.tokens.index(token)]
        except ValueError:
            return 0.0


class FinishReason(StrEnum):
    stop = "stop"
    length = "length"
    tool_calls = "tool_calls"
    cancelled = "cancelled"
    error = "error"


@dataclass(frozen=True, slots=True)
class TopLogprob:
    token: str
    logprob: float
    bytes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: str
    logprob: float
    bytes: tuple[int, ...]
    top_logprobs: tuple[TopLogprob, ...] = ()


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    # context_overflow: trim — prompt tokens dropped (oldest messages) to fit the context.
    dropped_tokens: int = 0
    # Speculative decoding (OpenAI's names): drafted tokens the model accepted and
    # rejected. A decoding strategy that drafts fills them; 0 without one.
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class ChatDelta:
    """One streamed piece of a chat answer, as the SDK hands it out.

    A tool call streams as `tool_call_deltas` (its name, then its arguments'
    fragments) and then arrives whole in `tool_calls` once the model has ended it.
    """

    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_deltas: tuple[ToolCallDelta, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    stop_sequence: str | None = None


@dataclass(slots=True)
class ChatResult:
    """A whole chat answer (the SDK's non-streaming result)."""

    content: str
    reasoning: str
    finish_reason: FinishReason
    usage: Usage
    tool_calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    stop_sequence: str | None = None


# LoRA adapters: (adapter id, scale) pairs. As a request's `lora`, the scales it asks for
# (adapters it leaves out get 0, as llama-server's); as what a decode applies
# (GenerationRequest.adapters), the non-zero ones by id, empty for the model's own weights.
Adapters = tuple[tuple[int, float], ...]


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A chat request as every dialect hands it to the SDK.

    `sampling` holds only what the caller set; unset values fall back to the
    model config, then to the defaults. `json_schema` is the schema as JSON text.
    """

    messages: tuple[ChatMessage, ...]
    model: str | None = None
    sampling: SamplingConfig | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    grammar: str | None = None
    json_schema: str | None = None
    enable_thinking: bool | None = None
    reasoning_effort: str | None = None
    template_kwargs: tuple[tuple[str, str | int | float | bool | None], ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = ToolChoice()
    parallel_tool_calls: bool = True
    # The last message is an assistant message whose text the answer continues (prefill).
    continue_final_message: bool = False
    # (token id, bias) pairs: OpenAI's logit_bias, -100 (a ban) to 100.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # How many answers (choices) to generate for the one prompt (`Kronk.start_choices`).
    n: int = 1
    # Context shift (the model's `context_shift`): the prompt's leading tokens kept when the
    # window fills, after the model's BOS (llama-server's n_keep; -1: the whole prompt).
    n_keep: int = 0
    # The LoRA adapters' scales for this request; None: the model's current ones.
    lora: Adapters | None = None


@dataclass(frozen=True, slots=True)
class InfillFile:
    """Another file of the project, shown to the model before the one being edited
    (llama-server's `input_extra`)."""

    filename: str
    text: str


@dataclass(frozen=True, slots=True)
class Infill:
    """Fill in the middle: the completion's prompt is the code before the cursor, `suffix`
    the code after it; `typed` is what was just typed after the prefix (llama-server's
    `prompt`), `files` other files of the project (kronk_core.infill lays them out)."""

    suffix: str
    typed: str = ""
    files: tuple[InfillFile, ...] = ()


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """A raw-text completion: the prompt as it stands, no chat template.

    `prompt` is text (the model's BOS is added, special-token text is parsed) or
    token ids (used as they are). `sampling` holds only what the caller set. With
    `infill`, the text prompt is the code before the cursor and the model writes what
    goes between it and the suffix, in its fill-in-the-middle tokens.
    """

    prompt: str | tuple[int, ...]
    model: str | None = None
    sampling: SamplingConfig | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    n: int = 1
    infill: Infill | None = None
    n_keep: int = 0  # as a ChatRequest's
    lora: Adapters | None = None  # as a ChatRequest's
