"""Pydantic models of POST /v1/responses and their mapping to core types."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from kronk_api.contract import FieldRules
from kronk_core.contract import (
    MEDIA_MARKER,
    WEB_SEARCH,
    ChatMessage,
    InvalidRequestError,
    Media,
    MediaSources,
    SamplingConfig,
    ServerTool,
    ToolCall,
    ToolChoice,
    ToolSpec,
)
from kronk_openai.schemas import arguments_text, sampling_of

_TEXT_PARTS = ("input_text", "output_text", "text", "reasoning_text", "summary_text")

# The one place that says what the dialect does with top-level fields it does not model
# (kronk_api.client_extras): unknown ones are accepted and logged once.
FIELDS = FieldRules(
    dialect="responses",
    ignored={
        "include": "asks for extra output data (encrypted reasoning, sources, logprobs) that "
        "Kronk does not produce; the answer is the same",
        "prompt_cache_key": "a hint for OpenAI's prompt cache; Kronk's cache strategy finds "
        "the shared prefix itself",
        "prompt_cache_retention": "how long OpenAI keeps its prompt cache",
        "client_metadata": "the client's own bookkeeping (thread and turn ids)",
        "safety_identifier": "who the end user is, for OpenAI's abuse checks",
        "user": "who the end user is, for OpenAI's abuse checks",
        "service_tier": "which of OpenAI's capacity pools serves the request",
        "truncation": "what OpenAI does when the input overflows the context; Kronk's is the "
        "model's context_overflow setting",
        "context_management": "OpenAI's server-side compaction past a threshold; Kronk "
        "answers context_length_exceeded and the client compacts",
        "top_logprobs": "log-probabilities of the output, which Responses answers from Kronk "
        "do not carry",
        "stream_options": "options of OpenAI's stream (obfuscation); Kronk's has none",
    },
    refused={
        "background": "background responses are not supported; leave background false",
        "conversation": "conversation objects are not supported; use previous_response_id instead",
        "prompt": "stored prompt templates are not supported; send the instructions and "
        "input in the request",
    },
)


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


# Input items other than messages and reasoning follow one rule. A `*_call` item with a
# `call_id` (function_call, custom_tool_call, local_shell_call, shell_call, apply_patch_call,
# ...) is a call of the assistant; a `*_call_output` item answers one. Items that are another
# server's records of its own work, with nothing a local model can read, are dropped; any
# other type is a 400.
DROPPED_ITEMS = {
    "compaction": "another server's encrypted summary of earlier turns",
    "web_search_call": "a search Kronk or another server ran; its results are not in the item",
}
# Keys of a call item that say nothing about what was called.
_BOOKKEEPING = frozenset({"type", "id", "call_id", "status", "caller", "name", "namespace"})


def prompt_name(name: str, namespace: str | None) -> str:
    """The name a namespaced tool has in the prompt: the namespace, a dot, its name."""
    return f"{namespace}.{name}" if namespace else name


class CallItem(BaseModel):
    """A call the assistant made: a function's, a custom tool's, or a built-in tool's."""

    model_config = ConfigDict(extra="allow")

    type: str
    call_id: str
    name: str | None = None
    namespace: str | None = None
    arguments: str | dict[str, Any] | None = None
    input: str | None = None

    def to_core(self) -> ToolCall:
        if self.type == "function_call":
            name = prompt_name(self.name or "", self.namespace)
            return ToolCall(self.call_id, name, _arguments(self.arguments or "{}"))
        if self.type == "custom_tool_call":
            name = prompt_name(self.name or "", self.namespace)
            return ToolCall(self.call_id, name, json.dumps({"input": self.input or ""}))
        # A built-in tool's call (local_shell_call and its action, ...): the tool is named by
        # the item's type, its arguments are what the item says beyond bookkeeping.
        details = {
            key: value
            for key, value in self.model_dump(exclude_none=True).items()
            if key not in _BOOKKEEPING
        }
        return ToolCall(self.call_id, self.type.removesuffix("_call"), json.dumps(details))


class CallOutputItem(BaseModel):
    """What a call returned; local_shell_call_output names its call by `id`."""

    model_config = ConfigDict(extra="ignore")

    type: str
    call_id: str | None = None
    id: str | None = None
    output: Any = ""

    @model_validator(mode="after")
    def _answers_a_call(self) -> CallOutputItem:
        if self.call_id is None and self.id is None:
            raise ValueError(f"a {self.type} item needs the call_id of the call it answers")
        return self

    def to_core(self) -> ChatMessage:
        output = self.output
        if isinstance(output, list) and all(
            isinstance(part, dict) and part.get("type") in _TEXT_PARTS for part in output
        ):
            text = "".join(str(part.get("text") or "") for part in output)
        else:
            text = output if isinstance(output, str) else json.dumps(output)
        return ChatMessage(role="tool", content=text, tool_call_id=self.call_id or self.id)


class DroppedItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str


class ReasoningItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["reasoning"]
    content: list[ContentPart] | None = None
    summary: list[ContentPart] = Field(default_factory=list)


def _item_type(value: Any) -> str | None:
    # Messages may leave out "type": a role is enough (EasyInputMessage).
    if isinstance(value, dict):
        kind = value.get("type") or ("message" if "role" in value else None)
    else:
        kind = getattr(value, "type", None)
    if not isinstance(kind, str) or kind in ("message", "reasoning"):
        return kind
    if kind in DROPPED_ITEMS:
        return "Dropped"
    if kind.endswith("_call_output"):
        return "CallOutput"
    if kind.endswith("_call"):
        return "Call"
    return kind


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[CallItem, Tag("Call")]
    | Annotated[CallOutputItem, Tag("CallOutput")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[DroppedItem, Tag("Dropped")],
    Discriminator(_item_type),
]


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def to_core(self, namespace: NamespaceTool | None = None) -> ToolSpec:
        return ToolSpec(
            name=prompt_name(self.name, namespace.name if namespace else None),
            description=_within(namespace, self.description or ""),
            parameters_json=json.dumps(self.parameters or {"type": "object"}),
        )


class CustomFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "grammar"] = "text"
    syntax: str | None = None
    definition: str | None = None


class CustomTool(BaseModel):
    """A tool that takes free text: offered to the model as a function of one string,
    `input`; its calls come back as custom_tool_call items."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["custom"]
    name: str
    description: str | None = None
    format: CustomFormat | None = None

    def to_core(self, namespace: NamespaceTool | None = None) -> ToolSpec:
        text = "The input, as free text."
        if self.format is not None and self.format.type == "grammar":
            # Shown, not enforced: as with a function's schema, only forced calls are
            # constrained, and a grammar of another syntax cannot be.
            grammar = f"{self.format.syntax} grammar:\n{self.format.definition}"
            text = f"The input, as text in this {grammar}"
        parameters = {
            "type": "object",
            "properties": {"input": {"type": "string", "description": text}},
            "required": ["input"],
        }
        return ToolSpec(
            name=prompt_name(self.name, namespace.name if namespace else None),
            description=_within(namespace, self.description or ""),
            parameters_json=json.dumps(parameters),
        )


class NamespaceTool(BaseModel):
    """Function and custom tools grouped under a name: each is offered to the model as
    `namespace.name`, and its calls come back with a `namespace` field."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["namespace"]
    name: Annotated[str, Field(min_length=1)]
    description: str = ""
    tools: list[Annotated[FunctionTool | CustomTool, Field(discriminator="type")]]


def _within(namespace: NamespaceTool | None, description: str) -> str:
    """A namespaced tool's description leads with what its namespace is for."""
    if namespace is None or not namespace.description:
        return description
    return f"({namespace.name}: {namespace.description}) {description}".rstrip()


class WebSearchFilters(BaseModel):
    model_config = ConfigDict(extra="ignore")

    allowed_domains: list[str] | None = None


# The types of OpenAI's built-in web search, dated and not.
WEB_SEARCH_TYPES = frozenset(
    {"web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11"}
)


class BuiltInTool(BaseModel):
    """A tool OpenAI runs or defines (web_search, file_search, local_shell, shell, mcp,
    computer_use_preview, ...). Web search is served by Kronk's web search server tool where
    one is registered (`served_by`); every other one is left out of the prompt and named in
    the omitted-tools header."""

    model_config = ConfigDict(extra="ignore")

    type: str
    # Web search's options: false asks for cached results only, which Kronk has not.
    external_web_access: bool | None = None
    filters: WebSearchFilters | None = None

    def served_by(self, available: Mapping[str, ServerTool]) -> ServerTool | None:
        """The server tool that serves this tool, if any. A web search that may not reach
        the web or must keep to some domains is not one Kronk can serve (its location and
        search_context_size are hints, and ignored)."""
        tool = available.get(WEB_SEARCH)
        if self.type not in WEB_SEARCH_TYPES or tool is None:
            return None
        if self.external_web_access is False:
            return None
        if self.filters is not None and self.filters.allowed_domains:
            return None
        return tool


def _tool_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return {"function": "Function", "custom": "Custom", "namespace": "Namespace"}.get(
        str(kind), "BuiltIn"
    )


Tool = Annotated[
    Annotated[FunctionTool, Tag("Function")]
    | Annotated[CustomTool, Tag("Custom")]
    | Annotated[NamespaceTool, Tag("Namespace")]
    | Annotated[BuiltInTool, Tag("BuiltIn")],
    Discriminator(_tool_kind),
]


@dataclass(frozen=True)
class ToolTarget:
    """What a function the model sees stands for in the client's terms."""

    name: str
    namespace: str | None = None
    custom: bool = False


@dataclass(frozen=True)
class ToolPlan:
    """The tools as the model sees them, what each stands for, the server tools that serve
    built-in ones (and the types they serve), and the types left out."""

    specs: tuple[ToolSpec, ...] = ()
    targets: Mapping[str, ToolTarget] = field(default_factory=dict)
    omitted: tuple[str, ...] = ()
    server: tuple[ServerTool, ...] = ()
    served: Mapping[str, str] = field(default_factory=dict)


def plan_tools(
    tools: Sequence[FunctionTool | CustomTool | NamespaceTool | BuiltInTool],
    available: Mapping[str, ServerTool] | None = None,
) -> ToolPlan:
    specs: list[ToolSpec] = []
    targets: dict[str, ToolTarget] = {}
    built_in: list[BuiltInTool] = []
    for tool in tools:
        if isinstance(tool, BuiltInTool):
            built_in.append(tool)
            continue
        members = tool.tools if isinstance(tool, NamespaceTool) else [tool]
        namespace = tool if isinstance(tool, NamespaceTool) else None
        for member in members:
            spec = member.to_core(namespace)
            specs.append(spec)
            targets[spec.name] = ToolTarget(
                member.name, namespace.name if namespace else None, isinstance(member, CustomTool)
            )
    # A server tool is offered once, and never under a name the client's own tools use.
    usable = {name: tool for name, tool in (available or {}).items() if name not in targets}
    server: dict[str, ServerTool] = {}
    served: dict[str, str] = {}
    omitted: list[str] = []
    for tool in built_in:
        found = tool.served_by(usable)
        if found is None:
            omitted.append(tool.type)
        else:
            server[found.name] = found
            served[tool.type] = found.name
    return ToolPlan(tuple(specs), targets, tuple(omitted), tuple(server.values()), served)


class NamedFunctionChoice(BaseModel):
    type: Literal["function", "custom"]
    name: str
    namespace: str | None = None


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
    """`summary` is accepted and ignored: Kronk returns the reasoning itself, not a summary."""

    model_config = ConfigDict(extra="ignore")

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None

    def template_effort(self) -> str | None:
        """The effort as chat templates know it (they stop at high)."""
        return "high" if self.effort == "xhigh" else self.effort


class ResponsesRequest(SamplingConfig):
    """POST /v1/responses. Fields it does not model follow FIELDS.

    Kronk's sampling fields (top_k, min_p, DRY, XTC, ...) are accepted as in
    chat completions; max_output_tokens is the length limit.
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True, strict=True)

    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    # The most built-in tool calls (web searches) Kronk runs for this response.
    max_tool_calls: Annotated[int, Field(ge=0)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    text: TextOptions | None = None
    reasoning: ReasoningOptions | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None

    @model_validator(mode="after")
    def _input_given(self) -> ResponsesRequest:
        if isinstance(self.input, list) and not self.input and self.previous_response_id is None:
            raise ValueError("input must not be empty")
        FIELDS.refuse(self.model_extra or {})
        return self

    def tool_plan(self, available: Mapping[str, ServerTool] | None = None) -> ToolPlan:
        """The tools, with the built-in ones `available` server tools serve."""
        return plan_tools(self.tools or (), available)

    def max_uses(self, plan: ToolPlan) -> dict[str, int]:
        """max_tool_calls, as the limit of each server tool that serves a built-in one."""
        if self.max_tool_calls is None:
            return {}
        return {tool.name: self.max_tool_calls for tool in plan.server}

    def sampling(self) -> SamplingConfig:
        return sampling_of(self)

    def choice(self) -> ToolChoice:
        if isinstance(self.tool_choice, NamedFunctionChoice):
            named = self.tool_choice
            return ToolChoice("function", prompt_name(named.name, named.namespace))
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
            elif isinstance(item, CallItem):
                messages.append(_with_call(messages, item.to_core(), reasoning))
                reasoning = None
            elif isinstance(item, CallOutputItem):
                messages.append(item.to_core())
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
