"""web_search as a server tool (`kronk_server_tools`): agents' built-in web search, served
with the search the MCP tool runs (kronk_mcp.web_search.run), its text and its errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
import mcp_types as types

from kronk_core.contract import ServerToolResult, Source, ToolError
from kronk_mcp import web_search
from kronk_mcp.brave import BraveSearch
from kronk_mcp.settings import McpSettings

# The MCP tool's error codes, as every dialect reads them.
_ERRORS: dict[str, ToolError] = {
    "invalid_argument": "invalid_input",
    "rate_limited": "rate_limited",
}


class WebSearchTool:
    """The web_search server tool of a server whose settings hold a Brave Search API key."""

    name = web_search.NAME
    description = web_search.TOOL.description or ""
    parameters: Mapping[str, Any] = web_search.INPUT_SCHEMA

    def __init__(self, settings: McpSettings, api_key: str) -> None:
        self._settings = settings
        self._key = api_key
        self.max_uses = settings.web_search_max_uses

    async def run(self, arguments: Mapping[str, Any]) -> ServerToolResult:
        settings = self._settings
        # A client of its own: the request that runs the search may run on any event loop.
        async with httpx.AsyncClient(timeout=None) as client:
            brave = BraveSearch(self._key, settings.brave_url, settings.brave_timeout, client)
            return server_result(await web_search.run(arguments, brave))


def server_result(result: types.CallToolResult) -> ServerToolResult:
    """The MCP tool's result as a server tool's: its text, its pages, its error."""
    text = "\n".join(part.text for part in result.content if isinstance(part, types.TextContent))
    structured = result.structured_content or {}
    if result.is_error:
        return ServerToolResult(text, error=_ERRORS.get(structured.get("error", ""), "unavailable"))
    sources = tuple(
        Source(url=found["url"], title=found["title"], page_age=found["age"])
        for found in structured.get("results", ())
    )
    return ServerToolResult(text, sources)
