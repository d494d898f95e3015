"""Server tools: tools the server runs itself, in the middle of a request.

A plugin offers them through `kronk_server_tools`. When a request's tools include one, the
model is offered it as a function; when the model calls it, Kronk runs it, appends the call
and its result to the conversation and goes on generating, all inside the one request
(kronk_core.tool_loop). The dialects serve their built-in tools with them: an agent's
built-in web search (OpenAI's `web_search`, Anthropic's `web_search_2025...`) is the server
tool named WEB_SEARCH, where one is registered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from kronk_core.contract.types import ToolSpec

# The name of the server tool that searches the web. Its arguments have `query`, the search
# text, which the dialects report; its results' sources are the pages found.
WEB_SEARCH = "web_search"

# Why a call failed, in words every dialect can map to its own codes: its arguments were
# wrong, the tool could not do its work (its service down, no key), its service refused for
# now (a rate limit, a quota), or the request used the tool as often as it may.
ToolError = Literal["invalid_input", "unavailable", "rate_limited", "max_uses_exceeded"]


@dataclass(frozen=True, slots=True)
class Source:
    """Something a call's result drew on: a web page found, with its title and how old the
    page is, in the tool's words (None: not known)."""

    url: str
    title: str = ""
    page_age: str | None = None


@dataclass(frozen=True, slots=True)
class ServerToolResult:
    """What one call gave: `text`, what the model reads (for a failed call, why it failed);
    the sources it drew on; `error` set when the call failed."""

    text: str
    sources: tuple[Source, ...] = ()
    error: ToolError | None = None


class ServerTool(Protocol):
    """A tool the server runs: what the model is shown (`name`, `description`, the JSON
    schema of its arguments as `parameters`) and `run`.

    `max_uses` bounds the calls one request may make (a client may ask for fewer).
    """

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def parameters(self) -> Mapping[str, Any]: ...

    @property
    def max_uses(self) -> int: ...

    async def run(self, arguments: Mapping[str, Any]) -> ServerToolResult:
        """Run one call with the model's arguments (a JSON object). A failure is a result
        with `error` set and a text that says why, for the model to read; an exception is
        logged and answered as `unavailable`."""
        ...


def tool_spec(tool: ServerTool) -> ToolSpec:
    """The function the model is offered for `tool`."""
    return ToolSpec(
        name=tool.name,
        description=tool.description,
        parameters_json=json.dumps(dict(tool.parameters)),
    )
