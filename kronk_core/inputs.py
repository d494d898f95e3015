"""Input coercion: the SDK's keyword arguments and dicts into checked core types."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kronk_core.contract.errors import InvalidRequestError
from kronk_core.contract.media import MEDIA_MARKER, Media, MediaKind
from kronk_core.contract.types import (
    Adapters,
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    ToolCall,
    ToolChoice,
    ToolSpec,
)
from kronk_core.runtime.embeddings import EmbeddingInput
from kronk_core.settings.config import SamplingConfig


def as_message(value: ChatMessage | Mapping[str, Any]) -> ChatMessage:
    """A ChatMessage, or a dict with its keys.

    `content` may be a list of parts: text (a string or `{"type": "text", "text": ...}`),
    and images and sounds (a `Media`, or `{"type": "image" | "audio", "data": bytes}` or
    `{"type": ..., "path": FILE}`, with an optional "media_type").
    """
    if isinstance(value, ChatMessage):
        return value
    role = value.get("role")
    if role not in ("system", "developer", "user", "assistant", "tool"):
        raise InvalidRequestError(f"unknown message role {role!r}", param="messages")
    keys = ("content", "name", "tool_call_id", "reasoning_content")
    texts = {key: value.get(key) for key in keys}
    media: tuple[Media, ...] = ()
    if isinstance(texts["content"], list | tuple):
        texts["content"], media = content_parts(texts["content"])
    for key, text in texts.items():
        if text is not None and not isinstance(text, str):
            raise InvalidRequestError(f"message {key} must be a string", param="messages")
    calls = value.get("tool_calls") or ()
    if not all(isinstance(call, ToolCall) for call in calls):
        raise InvalidRequestError("message tool_calls must be ToolCall objects", param="messages")
    return ChatMessage(
        role=role,
        content=texts["content"],
        name=texts["name"],
        tool_calls=tuple(calls),
        tool_call_id=texts["tool_call_id"],
        reasoning_content=texts["reasoning_content"],
        media=media,
    )


def content_parts(parts: Sequence[Any]) -> tuple[str, tuple[Media, ...]]:
    """SDK content parts → the message's text with a MEDIA_MARKER per item, and the items."""
    text: list[str] = []
    media: list[Media] = []
    for part in parts:
        if isinstance(part, str):
            text.append(part)
            continue
        if isinstance(part, Media):
            item = part
        elif isinstance(part, Mapping) and part.get("type") == "text":
            text.append(str(part.get("text", "")))
            continue
        elif isinstance(part, Mapping) and part.get("type") in ("image", "audio"):
            item = _sdk_media(part)
        else:
            raise InvalidRequestError(
                "a content part is a string, a Media, or a mapping of type text, image or audio",
                param="messages",
            )
        text.append(MEDIA_MARKER)
        media.append(item)
    return "".join(text), tuple(media)


def _sdk_media(part: Mapping[str, Any]) -> Media:
    media_type = part.get("media_type")
    if isinstance(part.get("data"), bytes | bytearray):
        item = Media.from_bytes(bytes(part["data"]), media_type)
    elif isinstance(part.get("path"), str | Path):
        item = Media.from_path(part["path"], media_type)
    else:
        raise InvalidRequestError(
            f"an {part['type']} part needs data (bytes) or a path", param="messages"
        )
    if item.kind is not MediaKind(part["type"]):
        raise InvalidRequestError(
            f"an {part['type']} part holds {item.media_type or item.kind.value}",
            param="messages",
        )
    return item


def as_tool_choice(value: ToolChoice | str) -> ToolChoice:
    """"auto", "none", "required", or the name of the one function to call."""
    if isinstance(value, ToolChoice):
        return value
    if value in ("auto", "none", "required"):
        return ToolChoice(value)  # type: ignore[arg-type]
    return ToolChoice("function", value)


def chat_request(
    messages: Sequence[ChatMessage | Mapping[str, Any]],
    *,
    model: str | None = None,
    max_tokens: int | None = None,
    stop: str | Sequence[str] = (),
    logprobs: bool = False,
    top_logprobs: int = 0,
    grammar: str | None = None,
    json_schema: str | None = None,
    enable_thinking: bool | None = None,
    reasoning_effort: str | None = None,
    chat_template_kwargs: Mapping[str, str | int | float | bool | None] | None = None,
    tools: Sequence[ToolSpec] = (),
    tool_choice: ToolChoice | str = "auto",
    parallel_tool_calls: bool = True,
    continue_final_message: bool = False,
    logit_bias: Mapping[int, float] | None = None,
    n: int = 1,
    n_keep: int = 0,
    lora: Mapping[int, float] | None = None,
    **sampling: Any,
) -> ChatRequest:
    """A ChatRequest from keyword arguments; sampling keys as in the manual.

    `tool_choice` is "auto", "none", "required" or the name of one of `tools`;
    `continue_final_message` continues the last (assistant) message's text; `n` asks for
    that many choices (`Kronk.start_choices`); `n_keep`: the prompt tokens a context shift
    keeps (-1: all); `lora`: adapter id → scale for the model's LoRA adapters (those left
    out: 0; None: the model's current scales).
    """
    overrides = _sampling_overrides(sampling, max_tokens, top_logprobs)
    return ChatRequest(
        messages=tuple(as_message(item) for item in messages),
        model=model,
        sampling=overrides,
        max_tokens=max_tokens,
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        grammar=grammar,
        json_schema=json_schema,
        enable_thinking=enable_thinking,
        reasoning_effort=reasoning_effort,
        template_kwargs=tuple((chat_template_kwargs or {}).items()),
        tools=tuple(tools),
        tool_choice=as_tool_choice(tool_choice),
        parallel_tool_calls=parallel_tool_calls,
        continue_final_message=continue_final_message,
        logit_bias=_logit_bias(logit_bias),
        n=n,
        n_keep=_n_keep(n_keep),
        lora=lora_scales(lora),
    )


def completion_request(
    prompt: str | Sequence[int],
    *,
    model: str | None = None,
    max_tokens: int | None = None,
    stop: str | Sequence[str] = (),
    logprobs: bool = False,
    top_logprobs: int = 0,
    logit_bias: Mapping[int, float] | None = None,
    n: int = 1,
    n_keep: int = 0,
    lora: Mapping[int, float] | None = None,
    **sampling: Any,
) -> CompletionRequest:
    """A CompletionRequest from keyword arguments: `prompt` is text or token ids."""
    overrides = _sampling_overrides(sampling, max_tokens, top_logprobs)
    if not isinstance(prompt, str):
        if not all(isinstance(token, int) and not isinstance(token, bool) for token in prompt):
            raise InvalidRequestError("prompt must be a string or token ids", param="prompt")
        prompt = tuple(prompt)
    return CompletionRequest(
        prompt=prompt,
        model=model,
        sampling=overrides,
        max_tokens=max_tokens,
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        logit_bias=_logit_bias(logit_bias),
        n=n,
        n_keep=_n_keep(n_keep),
        lora=lora_scales(lora),
    )


def _n_keep(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise InvalidRequestError("n_keep must be -1 (the whole prompt) or more", param="n_keep")
    return value


def lora_scales(value: Mapping[int, float] | None) -> Adapters | None:
    """Adapter id → scale, checked (ids against the model when the request is prepared)."""
    if value is None:
        return None
    pairs = []
    for adapter, scale in value.items():
        if not isinstance(adapter, int) or isinstance(adapter, bool) or adapter < 0:
            raise InvalidRequestError(f"lora: {adapter!r} is not an adapter id", param="lora")
        number = isinstance(scale, int | float) and not isinstance(scale, bool)
        if not number or not math.isfinite(scale):
            raise InvalidRequestError(
                f"lora: adapter {adapter}'s scale must be a finite number, got {scale!r}",
                param="lora",
            )
        pairs.append((adapter, float(scale)))
    return tuple(sorted(pairs))


def _logit_bias(value: Mapping[int, float] | None) -> tuple[tuple[int, float], ...]:
    """Token id → bias, checked: OpenAI's range, -100 (a ban) to 100."""
    pairs = []
    for token, bias in (value or {}).items():
        if not isinstance(token, int) or isinstance(token, bool):
            raise InvalidRequestError(
                f"logit_bias: keys must be token ids, got {token!r}", param="logit_bias"
            )
        if not isinstance(bias, int | float) or not -100.0 <= bias <= 100.0:
            raise InvalidRequestError(
                f"logit_bias: a bias must be between -100 and 100, got {bias!r}",
                param="logit_bias",
            )
        pairs.append((token, float(bias)))
    return tuple(pairs)


def _sampling_overrides(
    sampling: Mapping[str, Any], max_tokens: int | None, top_logprobs: int
) -> SamplingConfig:
    """The sampling keys a caller set, checked, and the limits every request shares."""
    try:
        overrides = SamplingConfig.model_validate(sampling)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        raise InvalidRequestError(f"{key}: {first['msg']}", param=key) from None
    if max_tokens is not None and max_tokens < 1:
        raise InvalidRequestError("max_tokens must be at least 1", param="max_tokens")
    if not 0 <= top_logprobs <= 5:
        raise InvalidRequestError("top_logprobs must be between 0 and 5", param="top_logprobs")
    return overrides


def forces_call(request: ChatRequest) -> bool:
    return request.tool_choice.mode in ("required", "function")


def check_chat(request: ChatRequest) -> None:
    """What a request must satisfy whatever the model: messages, stop strings, forced calls."""
    if not request.messages:
        raise InvalidRequestError("messages must not be empty", param="messages")
    for message in request.messages:
        if (message.content or "").count(MEDIA_MARKER) != len(message.media):
            raise InvalidRequestError(
                "a message's media must each have a MEDIA_MARKER in its content",
                param="messages",
            )
    if "" in request.stop:
        raise InvalidRequestError("stop: a stop sequence must not be empty", param="stop")
    for param, constraint in (("grammar", request.grammar), ("json_schema", request.json_schema)):
        if constraint is not None and not constraint.strip():
            raise InvalidRequestError(
                f"{param}: an empty {param} constrains nothing; leave it out instead", param=param
            )
    if request.continue_final_message:
        _check_continued(request.messages[-1])
        if request.enable_thinking:
            raise InvalidRequestError(
                "continue_final_message: a continued message cannot be combined with "
                "thinking (the answer goes on with its text)",
                param="enable_thinking",
            )
    choice = request.tool_choice
    if not forces_call(request):
        return
    if not request.tools:
        raise InvalidRequestError(
            f"tool_choice {choice.mode!r} needs at least one tool in tools", param="tool_choice"
        )
    if choice.mode == "function" and choice.name not in {tool.name for tool in request.tools}:
        raise InvalidRequestError(
            f"tool_choice names {choice.name!r}, which is not among the tools",
            param="tool_choice",
        )
    if request.grammar or request.json_schema:
        raise InvalidRequestError(
            "a forced tool call cannot be combined with a grammar or a JSON schema output",
            param="tool_choice",
        )


def check_completion(request: CompletionRequest) -> None:
    """What a raw completion must satisfy whatever the model."""
    # An empty prefix is a cursor at the file's start: fill in the middle needs none.
    if not request.prompt and request.infill is None:
        raise InvalidRequestError("prompt must not be empty", param="prompt")
    if "" in request.stop:
        raise InvalidRequestError("stop: a stop sequence must not be empty", param="stop")


def _check_continued(final: ChatMessage) -> None:
    """Only an assistant message's text can be continued: calls and reasoning cannot."""
    if final.role != "assistant":
        raise InvalidRequestError(
            "continue_final_message: the last message must be an assistant message, "
            f"not {final.role}",
            param="messages",
        )
    if final.tool_calls:
        raise InvalidRequestError(
            "continue_final_message: an assistant message with tool calls cannot be continued",
            param="messages",
        )
    if final.reasoning_content:
        raise InvalidRequestError(
            "continue_final_message: only an assistant message's text can be continued, "
            "not its reasoning",
            param="messages",
        )


def embedding_inputs(value: EmbeddingInput | Sequence[EmbeddingInput]) -> list[EmbeddingInput]:
    """One text, one token list, or a list of either → the list of inputs."""
    if isinstance(value, str):
        return [value]
    items = list(value)
    if not items:
        raise InvalidRequestError("input must not be empty", param="input")
    if all(isinstance(item, int) for item in items):
        return [items]  # type: ignore[list-item]
    if all(isinstance(item, str | Sequence) for item in items):
        return items  # type: ignore[return-value]
    raise InvalidRequestError(
        "input must be a string, a list of strings, or token ids", param="input"
    )
