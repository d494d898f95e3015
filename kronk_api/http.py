"""Request parsing every HTTP dialect shares; each maps the errors to its own shape."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from litestar import Request
from pydantic import BaseModel, ValidationError

from kronk_api.body_limits import PARSED_BODY
from kronk_api.disconnect import unless_disconnected
from kronk_core.contract.errors import CapabilityError, InvalidRequestError
from kronk_core.contract.media import MediaKind, MediaSources, is_remote
from kronk_core.media_fetch import fetch_urls
from kronk_core.sdk import Kronk

Body = TypeVar("Body", bound=BaseModel)
_UNPARSED = object()


def kronk_of(request: Request[Any, Any, Any]) -> Kronk:
    kronk: Kronk = request.app.state.kronk
    return kronk


async def media_sources(
    request: Request[Any, Any, Any], model: str | None, urls: list[str]
) -> MediaSources:
    """The media limits, and the request's http(s) image URLs fetched if the server may.

    Only for a model that reads images (CapabilityError first, so that a text model's
    request reaches no host), and only while the client waits: one that leaves cancels
    the fetch (ClientDisconnected).
    """
    kronk = kronk_of(request)
    limits = kronk.config.media
    if not limits.fetch_urls or not any(is_remote(url) for url in urls):
        return MediaSources(limits)
    # Loaded first, as the request would be: its projector is then known for certain.
    model_id = (await kronk.aload(model)).id
    reads = kronk.models.media(model_id)
    if not reads:
        raise CapabilityError(
            f"{model_id} has no projector: it does not read images or sounds, so the "
            "request's image URLs are not fetched (see docs/vision.md)",
            param="messages",
        )
    if MediaKind.image not in reads:
        raise CapabilityError(
            f"the projector of {model_id} reads "
            + " and ".join(sorted(kind.capability for kind in reads))
            + " input, not vision: the request's image URLs are not fetched",
            param="messages",
        )
    return MediaSources(limits, await unless_disconnected(request, fetch_urls(urls, limits)))


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
    return text.startswith("function-") or "[" in text or text in _TYPE_LABELS or text[:1].isupper()


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
