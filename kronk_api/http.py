"""Request parsing every HTTP dialect shares; each maps the errors to its own shape."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from litestar import Request
from pydantic import BaseModel, ValidationError

from kronk_api.body_limits import PARSED_BODY
from kronk_core.errors import InvalidRequestError
from kronk_core.media import MediaSources, fetch_urls
from kronk_core.sdk import Kronk

Body = TypeVar("Body", bound=BaseModel)
_UNPARSED = object()


def kronk_of(request: Request[Any, Any, Any]) -> Kronk:
    kronk: Kronk = request.app.state.kronk
    return kronk


async def media_sources(kronk: Kronk, urls: list[str]) -> MediaSources:
    """The media limits, and the request's http(s) image URLs fetched if the server may."""
    limits = kronk.config.media
    return MediaSources(limits, await fetch_urls(urls, limits))


def parse_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from None


def _is_branch_label(part: str | int) -> bool:
    """Pydantic names union members in error locations (`str`, `literal['a']`, a class).

    Field names in the dialects' schemas are snake_case, never capitalised.
    """
    text = str(part)
    return (
        text.startswith("function-") or "[" in text or text in _TYPE_LABELS or text[:1].isupper()
    )


_TYPE_LABELS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def invalid_body(exc: ValidationError) -> InvalidRequestError:
    """One pydantic error, as a message that names the field.

    For a union, the deepest error comes from the member that matched the
    value's shape, so it says more than "should be a valid string".
    """
    errors = exc.errors()
    first = max(errors, key=lambda error: len(error["loc"]))
    location = ".".join(str(part) for part in first["loc"] if not _is_branch_label(part))
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "missing":
        return InvalidRequestError(f"missing required field: {location}", param=location)
    if not location:
        return InvalidRequestError(message)
    return InvalidRequestError(f"{location}: {message}", param=location)


async def parse_body(request: Request[Any, Any, Any], model: type[Body]) -> Body:
    """The body as `model`; decoded once, by the body-limits guard when it ran."""
    data = request.state.get(PARSED_BODY, _UNPARSED)
    if data is _UNPARSED:
        data = parse_json(await request.body())
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid_body(exc) from None
