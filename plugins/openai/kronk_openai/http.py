"""Request helpers shared by the OpenAI routes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypeVar

from litestar import Request
from pydantic import BaseModel, ValidationError

from kronk_core.sdk import Kronk
from kronk_core.types import ChatDelta
from kronk_openai.errors import invalid_body, parse_json

# nginx's code for "client closed the request"; nobody receives it, the log shows it.
CLIENT_CLOSED_REQUEST = 499
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

Body = TypeVar("Body", bound=BaseModel)


def kronk_of(request: Request[Any, Any, Any]) -> Kronk:
    kronk: Kronk = request.app.state.kronk
    return kronk


async def parse_body(request: Request[Any, Any, Any], model: type[Body]) -> Body:
    data = parse_json(await request.body())
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid_body(exc) from None


async def chain(first: ChatDelta, rest: AsyncIterator[ChatDelta]) -> AsyncIterator[ChatDelta]:
    yield first
    async for delta in rest:
        yield delta
