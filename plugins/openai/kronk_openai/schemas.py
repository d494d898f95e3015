"""Pydantic models of the OpenAI requests Kronk accepts, and their mapping to core types."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kronk_core.contract import (
    MEDIA_MARKER,
    Adapters,
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    Infill,
    InfillFile,
    InvalidRequestError,
    Media,
    MediaSources,
    SamplingConfig,
    ToolCall,
    ToolChoice,
    ToolSpec,
    bare_base64,
)

JsonScalar = str | int | float | bool | None
# OpenAI's bound on n and best_of.
MAX_CHOICES = 128


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ImageUrl(BaseModel):
    url: str
    detail: str | None = None  # accepted; the projector decides the resolution


class ImagePart(BaseModel):
    type: Literal["image_url"]
    image_url: ImageUrl | str

    @property
    def url(self) -> str:
        return self.image_url if isinstance(self.image_url, str) else self.image_url.url


class InputAudio(BaseModel):
    data: str
    format: Literal["wav", "mp3"]


class AudioPart(BaseModel):
    type: Literal["input_audio"]
    input_audio: InputAudio


class FilePart(BaseModel):
    type: Literal["file"]


Part = Annotated[TextPart | ImagePart | AudioPart | FilePart, Field(discriminator="type")]


class FunctionCall(BaseModel):
    name: str
    # Non-compliant clients send an object instead of a JSON string.
    arguments: str | dict[str, Any] = "{}"

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, value: str | dict[str, Any]) -> str:
        return arguments_text(value)


def arguments_text(value: str | dict[str, Any]) -> str:
    """Tool-call arguments as JSON text of an object; a string must hold one."""
    if isinstance(value, dict):
        return json.dumps(value)
    try:
        parsed = json.loads(value or "{}")
    except json.JSONDecodeError:
        raise ValueError("tool call arguments must be a JSON object") from None
    if not isinstance(parsed, dict):
        raise ValueError("tool call arguments must be a JSON object")
    return value or "{}"


class ToolCallIn(BaseModel):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Part] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    def media_urls(self) -> list[str]:
        parts = self.content if isinstance(self.content, list) else []
        return [part.url for part in parts if isinstance(part, ImagePart)]

    def to_core(self, sources: MediaSources, where: str = "messages") -> ChatMessage:
        content = self.content
        media: tuple[Media, ...] = ()
        if isinstance(content, list):
            content, media = _content(content, sources, f"{where}.content")
        elif content is not None and self.role == "user":
            # The manual's plain base64 form: the whole text is an image or a sound.
            found = bare_base64(content, where=f"{where}.content", limit=sources.limits.max_bytes)
            if found is not None:
                content, media = MEDIA_MARKER, (found,)
        calls = tuple(
            ToolCall(id=call.id, name=call.function.name, arguments=str(call.function.arguments))
            for call in self.tool_calls or ()
        )
        return ChatMessage(
            role=self.role,
            content=content,
            name=self.name,
            tool_calls=calls,
            tool_call_id=self.tool_call_id,
            reasoning_content=self.reasoning_content,
            media=media,
        )


def _content(
    parts: list[TextPart | ImagePart | AudioPart | FilePart], sources: MediaSources, where: str
) -> tuple[str, tuple[Media, ...]]:
    """Content parts → text with a MEDIA_MARKER where each image or sound goes, and those."""
    text: list[str] = []
    media: list[Media] = []
    for index, part in enumerate(parts):
        at = f"{where}[{index}]"
        if isinstance(part, TextPart):
            text.append(part.text)
            continue
        if isinstance(part, ImagePart):
            item = sources.url(part.url, where=f"{at}.image_url")
        elif isinstance(part, AudioPart):
            audio = part.input_audio
            item = sources.base64(audio.data, f"audio/{audio.format}", where=f"{at}.input_audio")
        else:
            raise InvalidRequestError(
                f"{at}: file parts are not supported; send images as image_url parts",
                param="messages",
            )
        text.append(MEDIA_MARKER)
        media.append(item)
    return "".join(text), tuple(media)


class StreamOptions(BaseModel):
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    name: str = "response"
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs a json_schema object")
        return self


class FunctionSpec(BaseModel):
    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)


class ToolIn(BaseModel):
    type: Literal["function"]
    function: FunctionSpec

    def to_core(self) -> ToolSpec:
        return ToolSpec(
            name=self.function.name,
            description=self.function.description,
            parameters_json=json.dumps(self.function.parameters or {"type": "object"}),
        )


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


def tool_choice(value: str | NamedToolChoice | None) -> ToolChoice:
    if isinstance(value, NamedToolChoice):
        return ToolChoice("function", value.function.name)
    if value == "none":
        return ToolChoice("none")
    if value == "required":
        return ToolChoice("required")
    return ToolChoice()


def sampling_of(request: SamplingConfig) -> SamplingConfig:
    """Just the sampling fields of a request that extends SamplingConfig."""
    names = set(SamplingConfig.model_fields) - {"max_tokens"}
    return SamplingConfig.model_validate(request.model_dump(include=names, exclude_none=True))


def _thinking_flag(value: Any) -> Any:
    """The manual documents enable_thinking as the string "true"/"false"; accept both forms."""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


class UsageInStream(StrEnum):
    # OpenAI's stream_options.include_usage: a last chunk of its own, `usage: null` before.
    own_chunk = "own_chunk"
    # The manual's include_usage: on the chunk that carries finish_reason (as llama-server).
    finish_chunk = "finish_chunk"
    none = "none"


class LoraScale(BaseModel):
    """One LoRA adapter's scale, as llama-server's `lora` and /lora-adapters take it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: Annotated[int, Field(ge=0)]
    scale: Annotated[float, Field(allow_inf_nan=False)]


def lora_of(entries: list[LoraScale] | None) -> Adapters | None:
    return None if entries is None else tuple((entry.id, entry.scale) for entry in entries)


class _Generation(SamplingConfig):
    """What chat and raw completions share. Unknown fields are ignored, as OpenAI clients
    send extras; the sampling fields (temperature, top_k, DRY, XTC, ...) come from
    SamplingConfig under the names the manual and OpenAI use."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, strict=True)

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    # The manual's: usage on a stream's last chunk unless false (stream_options beats it).
    include_usage: bool = True
    # The manual's: the prompt as rendered for the model, in the answer (`prompt`).
    return_prompt: bool = False
    # Choices: each in a slot of its own (the model's n_seq_max bounds it too); OpenAI's 128.
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] = 1
    stop: list[str] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    # Token ids (as JSON keys) → a bias added to their logits.
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    user: str | None = None
    # llama-server's: the prompt tokens a context shift keeps (-1: all of them).
    n_keep: Annotated[int, Field(ge=-1)] = 0
    # llama-server's: the LoRA adapters' scales (those left out: 0); unset: the model's.
    lora: list[LoraScale] | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list) and len(value) > 4:
            raise ValueError(f"at most 4 stop sequences are allowed, got {len(value)}")
        if isinstance(value, list) and "" in value:
            raise ValueError("a stop sequence must not be empty")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not key.lstrip("-").isdigit():
                raise ValueError(f"keys must be token ids, got {key!r}")
        return value

    def biases(self) -> tuple[tuple[int, float], ...]:
        return tuple((int(token), bias) for token, bias in (self.logit_bias or {}).items())

    @property
    def usage_in_stream(self) -> UsageInStream:
        """Where a stream carries its usage: OpenAI's own chunk when stream_options asks for
        it, else (the manual's `include_usage`, on by default) on the chunk that finishes."""
        if self.stream_options is not None:
            if self.stream_options.include_usage:
                return UsageInStream.own_chunk
            if "include_usage" in self.stream_options.model_fields_set:
                return UsageInStream.none
        return UsageInStream.finish_chunk if self.include_usage else UsageInStream.none

    def sampling(self) -> SamplingConfig:
        return sampling_of(self)


class ChatCompletionRequest(_Generation):
    """POST /v1/chat/completions."""

    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    response_format: ResponseFormat | None = None
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    enable_thinking: bool | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, JsonScalar] | None = None
    tools: list[ToolIn] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    # None: continue a final assistant message without tool calls (llama-server's prefill).
    continue_final_message: bool | None = None

    @field_validator("enable_thinking", mode="before")
    @classmethod
    def _normalise_thinking(cls, value: Any) -> Any:
        return _thinking_flag(value)

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        both = self.max_tokens is not None and self.max_completion_tokens is not None
        if both and self.max_tokens != self.max_completion_tokens:
            raise ValueError("max_tokens and max_completion_tokens disagree")
        constraints = [
            self.grammar is not None,
            self.json_schema is not None,
            self.response_format is not None and self.response_format.type != "text",
        ]
        if sum(constraints) > 1:
            raise ValueError("use only one of grammar, json_schema and response_format")
        return self

    def schema_text(self) -> str | None:
        if self.json_schema is not None:
            return json.dumps(self.json_schema)
        if self.response_format is None or self.response_format.type == "text":
            return None
        if self.response_format.type == "json_object":
            return json.dumps({"type": "object"})
        assert self.response_format.json_schema is not None
        return json.dumps(self.response_format.json_schema.schema_ or {"type": "object"})

    def media_urls(self) -> list[str]:
        """The image URLs its messages name (those to fetch before `to_core`)."""
        return [url for message in self.messages for url in message.media_urls()]

    def to_core(self, sources: MediaSources | None = None) -> ChatRequest:
        stop = tuple(self.stop or ())
        sources = sources or MediaSources()
        return ChatRequest(
            messages=tuple(
                message.to_core(sources, f"messages[{index}]")
                for index, message in enumerate(self.messages)
            ),
            model=self.model,
            sampling=self.sampling(),
            max_tokens=self.max_completion_tokens or self.max_tokens,
            stop=stop,
            logprobs=self.logprobs or bool(self.top_logprobs),
            top_logprobs=self.top_logprobs or 0,
            grammar=self.grammar,
            json_schema=self.schema_text(),
            enable_thinking=self.enable_thinking,
            reasoning_effort=self.reasoning_effort,
            template_kwargs=tuple((self.chat_template_kwargs or {}).items()),
            tools=tuple(tool.to_core() for tool in self.tools or ()),
            tool_choice=tool_choice(self.tool_choice),
            parallel_tool_calls=self.parallel_tool_calls,
            continue_final_message=self._continues(),
            logit_bias=self.biases(),
            n=self.n,
            n_keep=self.n_keep,
            lora=lora_of(self.lora),
        )

    def _continues(self) -> bool:
        if self.continue_final_message is not None:
            return self.continue_final_message
        final = self.messages[-1]
        return final.role == "assistant" and not final.tool_calls


class TextCompletionRequest(_Generation):
    """POST /v1/completions: OpenAI's legacy completions, a raw prompt with no template."""

    prompt: str | list[str] | list[int] | list[list[int]]
    # OpenAI's default for this endpoint; 0 (echo only) needs prompt log-probabilities.
    max_tokens: Annotated[int, Field(ge=1)] = 16
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: bool = False
    suffix: str | None = None
    # Candidates generated, of which the n with the highest log-probability per token return.
    best_of: Annotated[int, Field(ge=1, le=MAX_CHOICES)] | None = None

    @model_validator(mode="after")
    def _check(self) -> TextCompletionRequest:
        if self.suffix and not isinstance(self.prompt, str):
            raise ValueError("suffix: fill in the middle needs the prompt as one text")
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of: must be at least n ({self.n}), got {self.best_of}")
        if self.stream and self.candidates > self.n:
            raise ValueError("best_of: the best of several candidates cannot be streamed")
        prompt = self.prompt_input()  # one prompt, or a ValueError that names the field
        if self.echo and not isinstance(prompt, str):
            raise ValueError("echo: only a text prompt can be echoed, not token ids")
        if self.echo and self.logprobs is not None:
            raise ValueError(
                "echo with logprobs would need the prompt's log-probabilities, which are not "
                "computed; ask for one or the other"
            )
        return self

    def prompt_input(self) -> str | tuple[int, ...]:
        """The one prompt: text or token ids (a list of one text or one id list counts)."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return prompt
        if len(prompt) != 1 and not all(isinstance(item, int) for item in prompt):
            raise ValueError(f"prompt: one prompt per request is supported, got {len(prompt)}")
        if not prompt or all(isinstance(item, int) for item in prompt):
            return tuple(item for item in prompt if isinstance(item, int))
        single = prompt[0]
        return single if isinstance(single, str) else tuple(single)  # type: ignore[arg-type]

    @property
    def candidates(self) -> int:
        """How many completions are generated: best_of, else n."""
        return self.best_of or self.n

    def to_core(self) -> CompletionRequest:
        # Picking the best candidates needs their tokens' log-probabilities.
        ranks = self.candidates > self.n
        return CompletionRequest(
            prompt=self.prompt_input(),
            model=self.model,
            sampling=self.sampling(),
            max_tokens=self.max_tokens,
            stop=tuple(self.stop or ()),
            logprobs=self.logprobs is not None or ranks,
            top_logprobs=self.logprobs or 0,
            logit_bias=self.biases(),
            n=self.candidates,
            n_keep=self.n_keep,
            lora=lora_of(self.lora),
            # OpenAI's fill in the middle: the prompt before the insertion, the suffix after.
            infill=Infill(suffix=self.suffix) if self.suffix else None,
        )


class InfillFileBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    filename: str = "tmp"  # llama-server's default
    text: str = ""


class InfillRequest(SamplingConfig):
    """POST /infill, llama-server's: the code before the cursor (`input_prefix`), after it
    (`input_suffix`), what was just typed (`prompt`), other files (`input_extra`). Fields
    of llama-server's own tuning that editors send (`n_indent`, `t_max_prompt_ms`,
    `t_max_predict_ms`, `samplers`, `cache_prompt`, `id_slot`, `response_fields`) are
    ignored: docs/api.md says why."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, strict=True)

    model: str | None = None
    # Required, as llama-server requires them (an empty string is a file's edge).
    input_prefix: str
    input_suffix: str
    input_extra: list[InfillFileBody] = Field(default_factory=list)
    prompt: str = ""
    # llama-server's -1 (the default): until the model stops or the window is full.
    n_predict: Annotated[int, Field(ge=-1)] = -1
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    stop: list[str] | None = None
    stream: bool = False
    lora: list[LoraScale] | None = None  # as a completion's

    def to_core(self) -> CompletionRequest:
        files = tuple(InfillFile(file.filename, file.text) for file in self.input_extra)
        wanted = self.max_tokens or (self.n_predict if self.n_predict > 0 else None)
        return CompletionRequest(
            prompt=self.input_prefix,
            model=self.model,
            sampling=sampling_of(self),
            max_tokens=wanted,
            stop=tuple(self.stop or ()),
            infill=Infill(suffix=self.input_suffix, typed=self.prompt, files=files),
            lora=lora_of(self.lora),
        )


class TokenizeRequest(BaseModel):
    """POST /v1/tokenize (Kronk's) and /tokenize (llama-server's): the text as `input` or as
    llama-server's `content`; without `model`, the default model."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    input: str | None = None
    content: str | None = None
    apply_template: bool = False
    add_generation_prompt: bool = True
    # llama-server's: add the model's BOS (and what else its tokenizer adds); read special
    # tokens' text (`<|im_start|>`) as those tokens; answer each token's text with its id.
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False

    @model_validator(mode="after")
    def _one_text(self) -> TokenizeRequest:
        if (self.input is None) == (self.content is None):
            raise ValueError("send the text as either input or content")
        if self.apply_template and (self.add_special or not self.parse_special):
            raise ValueError(
                "add_special and parse_special apply to raw text, not with apply_template"
            )
        return self

    @property
    def text(self) -> str:
        text = self.input if self.input is not None else self.content
        assert text is not None
        return text


class DetokenizeRequest(BaseModel):
    """POST /detokenize and /v1/detokenize (llama-server's): token ids to text."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    tokens: list[int]
