"""Pydantic models of the Ollama requests Kronk accepts, and their mapping to core types."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kronk_core.contract import (
    MEDIA_MARKER,
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    Media,
    MediaSources,
    SamplingConfig,
    ToolCall,
    parse_duration,
)
from kronk_openai.schemas import NamedToolChoice, ToolIn, sampling_of, tool_choice

LATEST = ":latest"
# Ollama's num_predict: -1 generates until the model stops, -2 until the context is full;
# Kronk stops at the context either way.
UNLIMITED = (-1, -2)
# Options that configure how Ollama loads a model; Kronk loads by the model's config entry.
LOAD_OPTIONS = (
    "numa",
    "num_ctx",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "low_vram",
    "f16_kv",
    "logits_all",
    "vocab_only",
    "use_mmap",
    "use_mlock",
    "embedding_only",
    "num_thread",
    "penalize_newline",
)
# Samplers Kronk does not have, with the value that turns each off in Ollama.
UNSUPPORTED_SAMPLERS = {"tfs_z": 1.0}


def model_id(name: str) -> str:
    """The Kronk id an Ollama name means: `model:latest` is `model`; other tags stay, as
    they are part of references such as `org/repo:Q4_K_M`."""
    return name.removesuffix(LATEST)


def ollama_name(model: str) -> str:
    """How /api/tags names a Kronk id: with Ollama's default tag unless it has one."""
    return model if ":" in model.rsplit("/", 1)[-1] else model + LATEST


def keep_alive_seconds(value: float | str) -> float | None:
    """Ollama's keep_alive (seconds, or a duration such as `5m`) as seconds; a negative
    value keeps the model loaded for good (None)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("-"):
            return None
        seconds = float(parse_duration(text))
    else:
        seconds = float(value)
    return None if seconds < 0 else seconds


class Options(SamplingConfig):
    """`options`: Ollama's sampling names, which are Kronk's (typical_p, mirostat,
    mirostat_tau and mirostat_eta among them, plus its other samplers: DRY, XTC, ...),
    num_predict and stop. Load-time options are accepted and ignored, as the model's config
    entry decides; unknown keys and samplers Kronk lacks are refused."""

    model_config = ConfigDict(extra="forbid")

    num_predict: int | None = None
    stop: list[Annotated[str, Field(min_length=1)]] | None = None
    tfs_z: float | None = None
    numa: bool | None = None
    num_ctx: int | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    logits_all: bool | None = None
    vocab_only: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    embedding_only: bool | None = None
    num_thread: int | None = None
    # The prompt tokens a context shift keeps (the model's `context_shift`; -1: all).
    num_keep: Annotated[int, Field(ge=-1)] | None = None
    penalize_newline: bool | None = None

    @field_validator(*UNSUPPORTED_SAMPLERS)
    @classmethod
    def _turned_off(cls, value: float | None, info: ValidationInfo) -> float | None:
        off = UNSUPPORTED_SAMPLERS[str(info.field_name)]
        if value is not None and value != off:
            raise ValueError(f"not supported by Kronk; only {off} (off) is accepted")
        return value

    @model_validator(mode="after")
    def _limits(self) -> Options:
        limit = self.num_predict
        if limit is not None and limit < 1 and limit not in UNLIMITED:
            raise ValueError("num_predict: must be at least 1, or -1 or -2 (no limit)")
        if self.num_predict is not None and self.max_tokens is not None:
            raise ValueError("num_predict and max_tokens both set; send num_predict")
        return self

    def limit(self) -> int | None:
        if self.num_predict is None:
            return self.max_tokens
        return None if self.num_predict in UNLIMITED else self.num_predict


class OllamaRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Annotated[str, Field(min_length=1)]
    keep_alive: float | str | None = None

    @field_validator("keep_alive")
    @classmethod
    def _duration(cls, value: float | str | None) -> float | str | None:
        if value is not None:
            keep_alive_seconds(value)  # a ValueError names the field
        return value

    @property
    def model_id(self) -> str:
        return model_id(self.model)

    def keep_alive_for(self) -> tuple[bool, float | None]:
        """Whether the request sets keep_alive, and to how many seconds (None: for good)."""
        if self.keep_alive is None:
            return False, None
        return True, keep_alive_seconds(self.keep_alive)


class OllamaGeneration(OllamaRequest):
    """What /api/chat and /api/generate share."""

    stream: bool = True
    options: Options | None = None
    # "json", a JSON schema, or "" (none).
    format: Literal["", "json"] | dict[str, Any] | None = None
    think: bool | Literal["low", "medium", "high"] | None = None
    logprobs: bool = False
    # Kronk keeps at most 5 alternatives per token (Ollama: 20).
    top_logprobs: Annotated[int, Field(ge=0, le=5)] | None = None

    def schema_text(self) -> str | None:
        if not self.format:
            return None
        if self.format == "json":
            return json.dumps({"type": "object"})
        return json.dumps(self.format)

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs or bool(self.top_logprobs)

    def generation(self) -> dict[str, Any]:
        """The ChatRequest/CompletionRequest fields both endpoints set the same way."""
        options = self.options or Options()
        return {
            "model": self.model_id,
            "sampling": sampling_of(options),
            "max_tokens": options.limit(),
            "stop": tuple(options.stop or ()),
            "logprobs": self.wants_logprobs,
            "top_logprobs": self.top_logprobs or 0,
            "n_keep": options.num_keep or 0,
        }

    def thinking(self) -> dict[str, Any]:
        if self.think is None or isinstance(self.think, bool):
            return {"enable_thinking": self.think}
        return {"enable_thinking": True, "reasoning_effort": self.think}


def _media(images: list[str], sources: MediaSources, where: str) -> tuple[Media, ...]:
    return tuple(
        sources.base64(image, None, where=f"{where}.images[{index}]")
        for index, image in enumerate(images)
    )


def _with_media(text: str, media: tuple[Media, ...]) -> str:
    """The images go before the text, one marker each, as Ollama puts them."""
    return "".join(MEDIA_MARKER for _ in media) + text


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str = ""
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None

    def to_core(self, sources: MediaSources, where: str) -> ChatMessage:
        media = _media(self.images or [], sources, where)
        calls = tuple(
            ToolCall(
                id=call.id or f"call_{index}",
                name=call.function.name,
                arguments=json.dumps(call.function.arguments),
            )
            for index, call in enumerate(self.tool_calls or ())
        )
        return ChatMessage(
            role=self.role,
            content=_with_media(self.content, media),
            name=self.tool_name,
            tool_calls=calls,
            tool_call_id=self.tool_call_id,
            reasoning_content=self.thinking,
            media=media,
        )


class ChatBody(OllamaGeneration):
    """POST /api/chat. No messages: load the model (or, with keep_alive 0, unload it)."""

    messages: list[Message] = Field(default_factory=list)
    # Ollama's tools are OpenAI's function tools.
    tools: list[ToolIn] | None = None
    # Kronk's extension, in OpenAI's shape: Ollama lets the model decide ("auto"); "required"
    # or a named function constrains the answer to a valid call, even on a small model.
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice = "auto"

    def to_core(self, sources: MediaSources) -> ChatRequest:
        final = self.messages[-1]
        return ChatRequest(
            messages=tuple(
                message.to_core(sources, f"messages[{index}]")
                for index, message in enumerate(self.messages)
            ),
            tools=tuple(tool.to_core() for tool in self.tools or ()),
            tool_choice=tool_choice(self.tool_choice),
            json_schema=self.schema_text(),
            # A final assistant message is a prefill: the answer continues it, as in Ollama.
            continue_final_message=final.role == "assistant" and not final.tool_calls,
            **self.generation(),
            **self.thinking(),
        )


class GenerateBody(OllamaGeneration):
    """POST /api/generate. No prompt: load the model (or, with keep_alive 0, unload it)."""

    prompt: str = ""
    system: str | None = None
    images: list[str] | None = None
    raw: bool = False
    suffix: str | None = None
    template: str | None = None
    context: list[int] | None = None

    @model_validator(mode="after")
    def _supported(self) -> GenerateBody:
        if self.suffix:
            raise ValueError("suffix: inserting text (fill in the middle) is not supported")
        if self.template:
            raise ValueError(
                "template: per-request templates are not supported; the model's chat template "
                "(or its config entry's) is used, or send raw: true with a formatted prompt"
            )
        if self.context:
            raise ValueError(
                "context: token context is not supported (it is deprecated in Ollama); "
                "use /api/chat with the conversation's messages"
            )
        if self.raw and (self.images or self.system or self.format or self.think):
            raise ValueError(
                "raw: a raw prompt goes to the model as it is, so it takes no images, system, "
                "format or think (they need the chat template)"
            )
        return self

    def to_chat(self, sources: MediaSources) -> ChatRequest:
        media = _media(self.images or [], sources, "")
        messages = [ChatMessage(role="user", content=_with_media(self.prompt, media), media=media)]
        if self.system:
            messages.insert(0, ChatMessage(role="system", content=self.system))
        return ChatRequest(
            messages=tuple(messages),
            json_schema=self.schema_text(),
            **self.generation(),
            **self.thinking(),
        )

    def to_completion(self) -> CompletionRequest:
        return CompletionRequest(prompt=self.prompt, **self.generation())


class EmbedBody(OllamaRequest):
    """POST /api/embed."""

    input: str | list[str]
    # Ollama truncates inputs longer than the context unless told not to.
    truncate: bool = True
    dimensions: Annotated[int, Field(ge=1)] | None = None
    options: Options | None = None

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else self.input


class EmbeddingsBody(OllamaRequest):
    """POST /api/embeddings, Ollama's older embedding endpoint: one prompt."""

    prompt: str
    options: Options | None = None


class NamedBody(BaseModel):
    """A request that names one model; older clients send `name`."""

    model_config = ConfigDict(extra="ignore")

    model: Annotated[str, Field(min_length=1)] | None = None
    name: Annotated[str, Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _named(self) -> Self:
        if self.model is None and self.name is None:
            raise ValueError("missing required field: model")
        return self

    @property
    def given_name(self) -> str:
        name = self.model or self.name
        assert name is not None
        return name

    @property
    def model_id(self) -> str:
        return model_id(self.given_name)


class ShowBody(NamedBody):
    """POST /api/show."""

    verbose: bool = False


class PullBody(NamedBody):
    """POST /api/pull: a reference the catalog can pull (`hf.co/org/repo:Q4_K_M`)."""

    # Ollama's switch for registries without TLS; a reference names its own scheme here.
    insecure: bool = False
    stream: bool = True


class DeleteBody(NamedBody):
    """DELETE /api/delete."""
