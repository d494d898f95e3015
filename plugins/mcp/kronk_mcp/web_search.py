"""The web_search tool: its schema, its arguments checked before any call out, its answer."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import mcp_types as types
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from kronk_mcp.brave import BraveSearch, SearchError, SearchQuery, WebResult

log = logging.getLogger(__name__)

NAME = "web_search"
MAX_QUERY_CHARS = 400
MAX_QUERY_WORDS = 50
_COUNTRY = re.compile(r"[A-Za-z]{2}|ALL|all")

NO_KEY = (
    "web_search needs a Brave Search API key (https://brave.com/search/api/): set "
    "KRONK_MCP_BRAVEAPIKEY (or --mcp-braveapikey) for the service kronk server start runs, "
    "or MCP_MCP_BRAVEAPIKEY for kronk mcp start"
)

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {
            "type": "string",
            "description": "Search query",
            "minLength": 1,
            "maxLength": MAX_QUERY_CHARS,
        },
        "count": {
            "type": "integer",
            "description": "Number of results to return (default 10, max 20)",
            "minimum": 1,
            "maximum": 20,
            "default": 10,
        },
        "country": {
            "type": "string",
            "description": "Country code for search context (e.g. US, GB, DE)",
        },
        "freshness": {
            "type": "string",
            "description": "Filter by freshness: pd (past day), pw (past week), "
            "pm (past month), py (past year)",
            "enum": ["pd", "pw", "pm", "py"],
        },
        "safesearch": {
            "type": "string",
            "description": "Safe search filter: off, moderate, strict (default moderate)",
            "enum": ["off", "moderate", "strict"],
            "default": "moderate",
        },
    },
    "required": ["query"],
    "additionalProperties": False,
}

TOOL = types.Tool(
    name=NAME,
    title="Web search",
    description="Performs a web search (Brave Search) and returns a list of relevant web pages "
    "with titles, URLs and descriptions.",
    input_schema=INPUT_SCHEMA,
    annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=True),
)

# What each argument must be, for the error that names it.
_EXPECTED = {
    "query": f"a non-empty search query of at most {MAX_QUERY_CHARS} characters "
    f"and {MAX_QUERY_WORDS} words",
    "count": "an integer from 1 to 20",
    "country": "a 2-letter country code such as US, GB or DE",
    "freshness": "one of pd (past day), pw (past week), pm (past month), py (past year)",
    "safesearch": "one of off, moderate, strict",
}


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):  # pydantic would take true as 1
        raise ValueError("a boolean is not a count")
    return value


def _query(value: Any) -> Any:
    if isinstance(value, str):
        value = value.strip()
        if not value or len(value) > MAX_QUERY_CHARS or len(value.split()) > MAX_QUERY_WORDS:
            raise ValueError("out of bounds")
    return value


def _country(value: Any) -> Any:
    if isinstance(value, str):
        if not _COUNTRY.fullmatch(value):
            raise ValueError("not a country code")
        return value.upper()
    return value


class Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: Annotated[str, BeforeValidator(_query), Field(strict=True)]
    count: Annotated[int, BeforeValidator(_not_bool), Field(ge=1, le=20)] = 10
    country: Annotated[str | None, BeforeValidator(_country)] = None
    freshness: Literal["pd", "pw", "pm", "py"] | None = None
    safesearch: Literal["off", "moderate", "strict"] = "moderate"


class ArgumentError(Exception):
    pass


def parse_arguments(arguments: Mapping[str, Any]) -> SearchQuery:
    """The checked query, or ArgumentError naming the first argument at fault."""
    try:
        parsed = Arguments.model_validate(dict(arguments))
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "arguments"
        if first["type"] == "extra_forbidden":
            known = ", ".join(Arguments.model_fields)
            message = f"unknown argument {name!r}; {NAME} takes {known}"
        elif first["type"] == "missing":
            message = f"missing argument {name!r}: expected {_EXPECTED[name]}"
        else:
            given = repr(arguments.get(name))
            given = given if len(given) <= 60 else given[:57] + "..."
            message = f"invalid argument {name!r}: expected {_EXPECTED[name]}, got {given}"
        raise ArgumentError(message) from None
    return SearchQuery(
        query=parsed.query,
        count=parsed.count,
        safesearch=parsed.safesearch,
        country=parsed.country,
        freshness=parsed.freshness,
    )


def error_result(message: str, code: str, retry_after: int | None = None) -> types.CallToolResult:
    structured: dict[str, Any] = {"error": code, "message": message}
    if retry_after is not None:
        structured["retry_after"] = retry_after
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)],
        structured_content=structured,
        is_error=True,
    )


def _as_text(query: str, results: list[WebResult]) -> str:
    if not results:
        return f"No web results for {query!r}."
    lines = [f"Web results for {query!r}:"]
    for number, result in enumerate(results, 1):
        lines += ["", f"{number}. {result.title}", f"   {result.url}"]
        if result.description:
            lines.append(f"   {result.description}")
        if result.age:
            lines.append(f"   Age: {result.age}")
    return "\n".join(lines)


def search_result(query: SearchQuery, results: list[WebResult]) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=_as_text(query.query, results))],
        structured_content={
            "query": query.query,
            "results": [
                {"title": r.title, "url": r.url, "description": r.description, "age": r.age}
                for r in results
            ],
        },
    )


async def run(arguments: Mapping[str, Any], brave: BraveSearch | None) -> types.CallToolResult:
    """One call: bad arguments and a missing key are answered without calling out."""
    try:
        query = parse_arguments(arguments)
    except ArgumentError as exc:
        return error_result(str(exc), "invalid_argument")
    if brave is None:
        return error_result(NO_KEY, "no_api_key")
    started = time.monotonic()
    try:
        results = await brave.search(query)
    except SearchError as exc:
        log.warning("web_search failed: %s", exc.message)
        return error_result(exc.message, exc.code, exc.retry_after)
    log.info("web_search: %d results in %.2f s", len(results), time.monotonic() - started)
    return search_result(query, results)
