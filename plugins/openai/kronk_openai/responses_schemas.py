"""Pydantic models of POST /v1/responses and their mapping to core types."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from kronk_core.errors import InvalidRequestError
from kronk_core.media import MEDIA_MARKER, Media, MediaSources
from kronk_core.settings.config import SamplingConfig
from kronk_core.types import ChatMessage, ToolCall, ToolChoice, ToolSpec
from kronk_openai.schemas import arguments_text, sampling_of

_TEXT_PARTS = ("input_text", "output_text", "text", "reasoning_text", "summary_text")


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: str | None = None
    # input_image: a data: or http(s) URL (file_id names an upload, which this server has not).
    image_url: str | None = None
    file_id: str | None = None


def _text(content: str | list[ContentPart] | None) -> str:
    """Text parts only: reasoning, summaries and outputs hold no media."""
    return _content(content, MediaSources(), "input")[0]


def _content(
    content: str | list[ContentPart] | None, sources: MediaSources, where: str
) -> tuple[str, tuple[Media, ...]]:
    """Parts → text with a MEDIA_MARKER where each input_image goes, and the images."""
    if content is None or isinstance(content, str):
        return content or "", ()
    text: list[str] = []
    media: list[Media] = []
    for index, part in enumerate(content):
        if part.type in _TEXT_PARTS:
            text.append(part.text or "")
        elif part.type == "input_image" and part.image_url:
            media.append(sources.url(part.image_url, where=f"{where}[{index}].image_url"))
            text.append(MEDIA_MARKER)
        else:
            raise InvalidRequestError(
                f"{where}[{index}]: content part type {part.type!r} is not supported "
                "(text parts, and input_image with an image_url, are)",
                param="input",
            )
    return "".join(text), tuple(media)


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart]


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str | dict[str, Any] = "{}"


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]


class ReasoningItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["reasoning"]
    content: list[ContentPart] | None = None
    summary: list[ContentPart] = Field(default_factory=list)


def _item_type(value: Any) -> str | None:
    # Messages may leave out "type": a role is enough (EasyInputMessage).
    if isinstance(value, dict):
        return value.get("type") or ("message" if "role" in value else None)
    return getattr(value, "type", None)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def to_core(self) -> ToolSpec:
        return ToolSpec(
            name=self.name,
            description=self.description or "",
            parameters_json=json.dumps(self.parameters or {"type": "object"}),
        )


class NamedFunctionChoice(BaseModel):
    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: TextFormat = Field(default_factory=TextFormat)


class ReasoningOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None


class ResponsesRequest(SamplingConfig):
    """POST /v1/responses. Unknown fields are ignored, as OpenAI clients send extras.

    Kronk's sampling fields (top_k, min_p, DRY, XTC, ...) are accepted as in
    chat completions; max_output_tokens is the length limit.
    """

    model_config = ConfigDict(extra="ignore", populate_by_name=True, strict=True)

    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    text: TextOptions | None = None
    reasoning: ReasoningOptions | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    # Not supported; named so that asking for them is an error, not silently ignored.
    background: bool = False
    conversation: str | dict[str, Any] | None = None

    @model_validator(mode="after")
    def _input_given(self) -> ResponsesRequest:
        if isinstance(self.input, list) and not self.input and self.previous_response_id is None:
            raise ValueError("input must not be empty")
        if self.background:
            raise ValueError("background responses are not supported; leave background false")
        if self.conversation is not None:
            raise ValueError(
                "conversation objects are not supported; use previous_response_id instead"
            )
        return self

    def sampling(self) -> SamplingConfig:
        return sampling_of(self)

    def choice(self) -> ToolChoice:
        if isinstance(self.tool_choice, NamedFunctionChoice):
            return ToolChoice("function", self.tool_choice.name)
        if self.tool_choice in ("none", "required"):
            return ToolChoice(self.tool_choice)
        return ToolChoice()

    def schema_text(self) -> str | None:
        text_format = self.text.format if self.text else TextFormat()
        if text_format.type == "json_object":
            return json.dumps({"type": "object"})
        if text_format.type == "json_schema":
            return json.dumps(text_format.schema_ or {"type": "object"})
        return None

    def media_urls(self) -> list[str]:
        """The image URLs its input names (those to fetch before `input_messages`)."""
        if isinstance(self.input, str):
            return []
        return [
            part.image_url
            for item in self.input
            if isinstance(item, MessageItem) and isinstance(item.content, list)
            for part in item.content
            if part.type == "input_image" and part.image_url
        ]

    def input_messages(self, sources: MediaSources | None = None) -> list[ChatMessage]:
        """The input items as chat messages (instructions are not among them)."""
        if isinstance(self.input, str):
            return [ChatMessage(role="user", content=self.input)]
        sources = sources or MediaSources()
        messages: list[ChatMessage] = []
        reasoning: str | None = None
        for index, item in enumerate(self.input):
            if isinstance(item, ReasoningItem):
                reasoning = _text(item.content or item.summary)
            elif isinstance(item, MessageItem):
                text, media = _content(item.content, sources, f"input[{index}].content")
                messages.append(
                    ChatMessage(
                        role=item.role,
                        content=text,
                        reasoning_content=reasoning if item.role == "assistant" else None,
                        media=media,
                    )
                )
                reasoning = None
            elif isinstance(item, FunctionCallItem):
                call = ToolCall(item.call_id, item.name, _arguments(item.arguments))
                messages.append(_with_call(messages, call, reasoning))
                reasoning = None
            else:
                messages.append(
                    ChatMessage(role="tool", content=_text(item.output), tool_call_id=item.call_id)
                )
        return messages


def _arguments(value: str | dict[str, Any]) -> str:
    try:
        return arguments_text(value)
    except ValueError as exc:
        raise InvalidRequestError(f"function_call: {exc}", param="input") from None


def _with_call(messages: list[ChatMessage], call: ToolCall, reasoning: str | None) -> ChatMessage:
    """Consecutive function_call items are one assistant turn with several calls."""
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant" and last.tool_calls:
        messages.pop()
        return ChatMessage(
            role="assistant",
            content=last.content,
            tool_calls=(*last.tool_calls, call),
            reasoning_content=last.reasoning_content,
        )
    if last is not None and last.role == "assistant" and reasoning is None:
        messages.pop()
        return ChatMessage(
            role="assistant",
            content=last.content,
            tool_calls=(call,),
            reasoning_content=last.reasoning_content,
        )
    return ChatMessage(role="assistant", tool_calls=(call,), reasoning_content=reasoning)
