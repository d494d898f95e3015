"""Pydantic models of the Anthropic requests Kronk accepts, and their mapping to core types."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from kronk_api.contract import FieldRules
from kronk_core.contract import (
    MEDIA_MARKER,
    WEB_SEARCH,
    ChatMessage,
    ChatRequest,
    Media,
    MediaSources,
    SamplingConfig,
    ServerTool,
    ToolCall,
    ToolChoice,
    ToolSpec,
)

# Separates the text blocks of one message: they are distinct paragraphs to the client.
BLOCK_SEPARATOR = "\n\n"

# The one place that says what the dialect does with top-level fields it does not model
# (kronk_api.client_extras): unknown ones are accepted and logged once.
FIELDS = FieldRules(
    dialect="anthropic",
    ignored={
        "metadata": "who is asking (user_id), for the caller's records; not part of the prompt",
        "service_tier": "which of Anthropic's capacity pools serves the request",
        "inference_geo": "where Anthropic runs the request",
        "speed": "fast mode of Anthropic's own models",
        "diagnostics": "reports on Anthropic's prompt cache",
        "cache_control": "asks Anthropic to cache the prompt; Kronk's cache strategy caches "
        "every prompt unasked",
        "container": "the container of Anthropic's code-execution tool, which Kronk leaves out",
        "context_management": "Anthropic's server-side edits of earlier turns (clearing old "
        "thinking or tool results); Kronk prompts the conversation as sent, and the chat "
        "template decides which earlier thinking it renders",
    },
    refused={
        "mcp_servers": "remote MCP servers are not supported; connect the MCP server to the "
        "agent and send its tools as custom tools",
    },
)

# Anthropic's effort levels → the reasoning_effort chat templates know.
_EFFORT = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}


class _Block(BaseModel):
    # cache_control, citations and other annotations are accepted and ignored.
    model_config = ConfigDict(extra="ignore")


class TextBlock(_Block):
    type: Literal["text"]
    text: str


class Base64Source(BaseModel):
    type: Literal["base64"]
    media_type: str
    data: str


class UrlSource(BaseModel):
    type: Literal["url"]
    url: str


class ImageBlock(_Block):
    type: Literal["image"]
    source: Annotated[Base64Source | UrlSource, Field(discriminator="type")]

    def media(self, sources: MediaSources, where: str) -> Media:
        source = self.source
        if isinstance(source, UrlSource):
            return sources.url(source.url, where=f"{where}.source.url")
        return sources.base64(source.data, source.media_type, where=f"{where}.source.data")


class AudioBlock(_Block):
    """Anthropic's API has no sound blocks: one a client sends anyway is refused with where
    Kronk reads sound."""

    type: Literal["audio", "input_audio"]

    @model_validator(mode="after")
    def _refused(self) -> AudioBlock:
        raise ValueError(
            "Anthropic Messages takes no sound: send it to /v1/audio/transcriptions, or as "
            "an input_audio part to /v1/chat/completions (docs/vision.md)"
        )


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(_Block):
    """Another server's encrypted reasoning: nothing a local model can read, so it is dropped."""

    type: Literal["redacted_thinking"]


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ServerToolUseBlock(_Block):
    """A call of a tool the server ran (Kronk's web search, in an earlier answer)."""

    type: Literal["server_tool_use"]
    id: str
    name: str
    input: dict[str, Any]

    def to_core(self) -> ToolCall:
        return ToolCall(id=self.id, name=self.name, arguments=json.dumps(self.input))


class WebSearchResult(_Block):
    type: Literal["web_search_result"]
    url: str
    title: str = ""
    page_age: str | None = None


class WebSearchError(_Block):
    type: Literal["web_search_tool_result_error"]
    error_code: str


class WebSearchToolResultBlock(_Block):
    """What a web search the server ran found: the tool turn after its server_tool_use.

    Its text for the model is rebuilt from the results (titles, URLs, page ages): the
    descriptions the model read then are not in the block.
    """

    type: Literal["web_search_tool_result"]
    tool_use_id: str
    content: list[WebSearchResult] | WebSearchError

    def to_core(self) -> ChatMessage:
        if isinstance(self.content, WebSearchError):
            text = f"Error: {self.content.error_code}"
        elif not self.content:
            text = "No web results."
        else:
            lines = ["Web results:"]
            for number, result in enumerate(self.content, 1):
                lines += ["", f"{number}. {result.title}", f"   {result.url}"]
                if result.page_age:
                    lines.append(f"   Age: {result.page_age}")
            text = "\n".join(lines)
        return ChatMessage(role="tool", content=text, tool_call_id=self.tool_use_id)


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]] = ""
    is_error: bool = False

    def to_core(self, sources: MediaSources, where: str) -> ChatMessage:
        media: tuple[Media, ...] = ()
        if isinstance(self.content, str):
            text = self.content
        else:
            text, media = _joined(self.content, sources, f"{where}.content")
        # Templates have no error flag; the model learns of the failure from the text.
        return ChatMessage(
            role="tool",
            content=f"Error: {text}" if self.is_error else text,
            tool_call_id=self.tool_use_id,
            media=media,
        )


ContentBlock = Annotated[
    TextBlock
    | ImageBlock
    | AudioBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | ToolUseBlock
    | ToolResultBlock
    | ServerToolUseBlock
    | WebSearchToolResultBlock,
    Field(discriminator="type"),
]

_ALLOWED = {
    "user": (TextBlock, ImageBlock, ToolResultBlock),
    "assistant": (
        TextBlock,
        ThinkingBlock,
        RedactedThinkingBlock,
        ToolUseBlock,
        ServerToolUseBlock,
        WebSearchToolResultBlock,
    ),
    "system": (TextBlock,),
}


def _joined(
    blocks: Sequence[TextBlock | ImageBlock], sources: MediaSources, where: str
) -> tuple[str, tuple[Media, ...]]:
    """Text and image blocks → their text with a MEDIA_MARKER per image, and the images."""
    pieces: list[str] = []
    media: list[Media] = []
    for index, block in enumerate(blocks):
        if isinstance(block, ImageBlock):
            media.append(block.media(sources, f"{where}[{index}]"))
            pieces.append(MEDIA_MARKER)
        else:
            pieces.append(block.text)
    return BLOCK_SEPARATOR.join(pieces), tuple(media)


def image_urls(blocks: Sequence[Any]) -> list[str]:
    """The URLs of the image blocks among `blocks` and in their tool results."""
    urls = []
    for block in blocks:
        if isinstance(block, ToolResultBlock) and isinstance(block.content, list):
            urls += image_urls(block.content)
        elif isinstance(block, ImageBlock) and isinstance(block.source, UrlSource):
            urls.append(block.source.url)
    return urls


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    # A system message among the messages applies from where it stands (its per-message
    # output_config is ignored: the request's effort applies to the whole answer).
    role: Literal["user", "assistant", "system"]
    content: list[ContentBlock]
    # A system message's lifetime: "next_user_message" shows it only until a later user
    # message exists.
    clear_at: Literal["next_user_message", "never"] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _string_is_one_block(cls, value: Any) -> Any:
        return [{"type": "text", "text": value}] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _blocks_fit_role(self) -> Message:
        for block in self.content:
            if not isinstance(block, _ALLOWED[self.role]):
                raise ValueError(f"{block.type} blocks are not allowed in a {self.role} message")
        return self

    def to_core(self, sources: MediaSources, where: str) -> list[ChatMessage]:
        if self.role == "assistant":
            return self._assistant()
        if self.role == "system":
            text = BLOCK_SEPARATOR.join(
                block.text for block in self.content if isinstance(block, TextBlock)
            )
            return [ChatMessage(role="system", content=text)] if text else []
        # Tool results become tool messages and text a user message, in the order given.
        out: list[ChatMessage] = []
        texts: list[TextBlock | ImageBlock] = []
        for index, block in enumerate(self.content):
            if isinstance(block, ToolResultBlock):
                out.extend(_user(texts, sources, where))
                texts = []
                out.append(block.to_core(sources, f"{where}.content[{index}]"))
            else:
                assert isinstance(block, TextBlock | ImageBlock)
                texts.append(block)
        return out + _user(texts, sources, where)

    def _assistant(self) -> list[ChatMessage]:
        """The assistant's turns: a search the server ran ends the turn that called it, and
        its result is a tool turn before the answer goes on."""
        turns: list[ChatMessage] = []
        blocks: list[Any] = []
        for block in self.content:
            if isinstance(block, WebSearchToolResultBlock):
                turns += [_assistant_turn(blocks), block.to_core()]
                blocks = []
            else:
                blocks.append(block)
        if blocks or not turns:
            turns.append(_assistant_turn(blocks))
        return turns


def _assistant_turn(blocks: Sequence[Any]) -> ChatMessage:
    text = [block.text for block in blocks if isinstance(block, TextBlock)]
    thinking = [block.thinking for block in blocks if isinstance(block, ThinkingBlock)]
    calls = tuple(
        block.to_core() if isinstance(block, ServerToolUseBlock) else _tool_call(block)
        for block in blocks
        if isinstance(block, ToolUseBlock | ServerToolUseBlock)
    )
    return ChatMessage(
        role="assistant",
        content=BLOCK_SEPARATOR.join(text) if text else None,
        tool_calls=calls,
        reasoning_content=BLOCK_SEPARATOR.join(thinking) if thinking else None,
    )


def _tool_call(block: ToolUseBlock) -> ToolCall:
    return ToolCall(id=block.id, name=block.name, arguments=json.dumps(block.input))


def _user(
    blocks: list[TextBlock | ImageBlock], sources: MediaSources, where: str
) -> list[ChatMessage]:
    if not blocks:
        return []
    text, media = _joined(blocks, sources, f"{where}.content")
    return [ChatMessage(role="user", content=text, media=media)]


class CustomTool(BaseModel):
    """A tool the client runs: name, description and the JSON schema of its input."""

    model_config = ConfigDict(extra="ignore")

    name: Annotated[str, Field(min_length=1)]
    description: str = ""
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None

    def to_core(self) -> ToolSpec:
        return ToolSpec(
            name=self.name,
            description=self.description,
            parameters_json=json.dumps(self.input_schema),
        )


class DefinedTool(BaseModel):
    """A tool Anthropic defines by its versioned type (web_search_20250305, bash_20250124,
    code_execution_..., text_editor_...). Web search is served by Kronk's web search server
    tool where one is registered (`served_by`); Kronk has no definition of the others to
    show the model, so they are left out of the prompt and named in the omitted-tools
    header."""

    model_config = ConfigDict(extra="ignore")

    type: str
    name: str = ""
    # Web search's options: at most this many searches in the request; results only from
    # (or never from) these domains. user_location is a hint, and ignored.
    max_uses: Annotated[int, Field(ge=1)] | None = None
    allowed_domains: list[str] | None = None
    blocked_domains: list[str] | None = None

    def served_by(self, available: Mapping[str, ServerTool]) -> ServerTool | None:
        """The server tool that serves this tool, if any: a web search that must keep to or
        away from some domains is not one Kronk can serve."""
        tool = available.get(WEB_SEARCH)
        if not self.type.startswith("web_search_") or self.name != WEB_SEARCH or tool is None:
            return None
        if self.allowed_domains or self.blocked_domains:
            return None
        return tool


def _tool_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "CustomTool" if kind in (None, "custom") else "DefinedTool"


Tool = Annotated[
    Annotated[CustomTool, Tag("CustomTool")] | Annotated[DefinedTool, Tag("DefinedTool")],
    Discriminator(_tool_kind),
]


@dataclass(frozen=True)
class ToolPlan:
    """The server tools that serve the request's defined tools (with each one's max_uses,
    and the types they serve), and the types left out."""

    server: tuple[ServerTool, ...] = ()
    max_uses: Mapping[str, int] = field(default_factory=dict)
    served: Mapping[str, str] = field(default_factory=dict)
    omitted: tuple[str, ...] = ()


_CHOICE_MODES: dict[str, Literal["auto", "required", "none"]] = {
    "auto": "auto",
    "any": "required",
    "none": "none",
}


class ToolChoiceParam(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _named(self) -> ToolChoiceParam:
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice of type tool needs a name")
        return self

    def to_core(self) -> ToolChoice:
        if self.type == "tool":
            return ToolChoice(mode="function", name=self.name)
        return ToolChoice(mode=_CHOICE_MODES[self.type])


class ThinkingParam(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    # "adaptive" lets the model decide, "between_tools" thinks between tool calls: a local
    # model given the option thinks when it will.
    type: Literal["enabled", "adaptive", "between_tools", "disabled"]
    # Accepted for compatibility; a local model's reasoning has no token budget.
    budget_tokens: Annotated[int, Field(ge=1)] | None = None
    # "omitted" asks Anthropic to leave the thinking text out; Kronk returns the reasoning
    # the model wrote.
    display: Literal["summarized", "omitted"] | None = None


class JsonOutputFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    """Effort is passed to the template as reasoning_effort; a format constrains the answer.
    task_budget, an advisory countdown, is accepted and ignored."""

    model_config = ConfigDict(extra="ignore")

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: JsonOutputFormat | None = None


class Conversation(BaseModel):
    """What /v1/messages and /v1/messages/count_tokens share: the prompt. Fields it does
    not model follow FIELDS."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: Annotated[str, Field(min_length=1)]
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None
    output_config: OutputConfig | None = None
    # The structured-outputs beta's spelling of output_config.format.
    output_format: JsonOutputFormat | None = None

    @model_validator(mode="after")
    def _refused_fields(self) -> Conversation:
        FIELDS.refuse(self.model_extra or {})
        return self

    def media_urls(self) -> list[str]:
        """The image URLs the messages name (those to fetch before `to_core`)."""
        return [url for message in self.messages for url in image_urls(message.content)]

    def tool_plan(self, available: Mapping[str, ServerTool] | None = None) -> ToolPlan:
        """Which defined tools `available` server tools serve; the others are left out. A
        server tool is never offered under a name the client's own tools use."""
        tools = self.tools or ()
        own = {tool.name for tool in tools if isinstance(tool, CustomTool)}
        usable = {name: tool for name, tool in (available or {}).items() if name not in own}
        server: dict[str, ServerTool] = {}
        max_uses: dict[str, int] = {}
        served: dict[str, str] = {}
        omitted: list[str] = []
        for tool in tools:
            if not isinstance(tool, DefinedTool):
                continue
            found = tool.served_by(usable)
            if found is None:
                omitted.append(tool.type)
                continue
            server[found.name] = found
            served[tool.type] = found.name
            if tool.max_uses is not None:
                max_uses[found.name] = tool.max_uses
        return ToolPlan(tuple(server.values()), max_uses, served, tuple(omitted))

    def omitted_tools(self, available: Mapping[str, ServerTool] | None = None) -> list[str]:
        """The types of the tools left out of the prompt, as the client sent them."""
        return list(self.tool_plan(available).omitted)

    def core_messages(self, sources: MediaSources) -> tuple[ChatMessage, ...]:
        out: list[ChatMessage] = []
        system = self.system
        if isinstance(system, list):
            system = BLOCK_SEPARATOR.join(block.text for block in system)
        if system:
            out.append(ChatMessage(role="system", content=system))
        last_user = max(
            (index for index, message in enumerate(self.messages) if message.role == "user"),
            default=-1,
        )
        for index, message in enumerate(self.messages):
            if message.clear_at == "next_user_message" and index < last_user:
                continue
            out.extend(message.to_core(sources, f"messages[{index}]"))
        return tuple(out)

    def _json_schema(self) -> str | None:
        output = self.output_config.format if self.output_config else None
        output = output or self.output_format
        return None if output is None else json.dumps(output.schema_ or {"type": "object"})

    def to_core(self, sources: MediaSources | None = None) -> ChatRequest:
        choice = self.tool_choice
        effort = self.output_config.effort if self.output_config else None
        messages = self.core_messages(sources or MediaSources())
        return ChatRequest(
            messages=messages,
            model=self.model,
            tools=tuple(
                tool.to_core() for tool in self.tools or () if isinstance(tool, CustomTool)
            ),
            tool_choice=choice.to_core() if choice is not None else ToolChoice(),
            parallel_tool_calls=choice is None or not choice.disable_parallel_tool_use,
            enable_thinking=self.thinking is not None and self.thinking.type != "disabled",
            reasoning_effort=None if effort is None else _EFFORT[effort],
            json_schema=self._json_schema(),
            # A final assistant message is a prefill: the answer continues its text (unless
            # it ends with a search's result: the answer then starts a turn of its own).
            continue_final_message=bool(messages) and messages[-1].role == "assistant",
        )


class CountTokensRequest(Conversation):
    """POST /v1/messages/count_tokens."""


class MessagesRequest(Conversation):
    """POST /v1/messages."""

    max_tokens: Annotated[int, Field(ge=1)]
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = None
    stream: bool = False
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None

    def to_core(self, sources: MediaSources | None = None) -> ChatRequest:
        return replace(
            super().to_core(sources),
            sampling=SamplingConfig(
                temperature=self.temperature, top_p=self.top_p, top_k=self.top_k
            ),
            max_tokens=self.max_tokens,
            stop=tuple(self.stop_sequences or ()),
        )
