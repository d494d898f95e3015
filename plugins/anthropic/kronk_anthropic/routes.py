"""Anthropic routes: messages (streaming or not) and count_tokens."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Request, Response, Router, post
from litestar.response import Stream

from kronk_anthropic.errors import ANTHROPIC
from kronk_anthropic.responses import ContentBlocks, message_dict, usage_dict
from kronk_anthropic.schemas import FIELDS, Conversation, CountTokensRequest, MessagesRequest
from kronk_anthropic.stream import sse
from kronk_api.client_extras import omitted_tools, unknown_fields
from kronk_api.endpoints import subject_of
from kronk_api.http import kronk_of, media_sources, parse_body
from kronk_core.sdk import ChatStream
from kronk_core.types import ChatDelta

# Grants of the auth guard are per endpoint; both routes belong to "messages".
_OPT = {"kronk_endpoint": "messages"}


def _extras(request: Request[Any, Any, Any], body: Conversation) -> dict[str, str]:
    """What the request holds beyond what Kronk serves, logged once; the response headers
    that name the tools left out."""
    unknown_fields(request, FIELDS, body.model_extra or {})
    return omitted_tools(request, "anthropic", body.omitted_tools())


@post("/v1/messages", status_code=200, opt=_OPT)
async def create_message(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
    body = await parse_body(request, MessagesRequest)
    headers = _extras(request, body)
    kronk = kronk_of(request)
    sources = await media_sources(request, body.model, body.media_urls())
    stream = await kronk.start_chat(body.to_core(sources), subject=subject_of(request))
    message_id = f"msg_{uuid.uuid4().hex}"
    if body.stream:
        answer: Response[Any] | Stream = await ANTHROPIC.open_stream(
            request,
            aiter(stream),
            lambda deltas: sse(message_id, stream.model_id, stream.prompt_tokens, deltas),
        )
    else:
        whole = await ANTHROPIC.respond(request, _answer(stream, message_id))
        answer = whole if isinstance(whole, Response) else Response(whole)
    answer.headers.update(headers)
    return answer


async def _answer(stream: ChatStream, message_id: str) -> dict[str, Any]:
    blocks = ContentBlocks()
    last: ChatDelta | None = None
    async for delta in stream:
        blocks.feed(delta)
        if delta.finish_reason is not None:
            last = delta
    blocks.close()
    assert last is not None and last.usage is not None
    return message_dict(message_id, stream.model_id, blocks.content, last, usage_dict(last.usage))


@post("/v1/messages/count_tokens", status_code=200, opt=_OPT)
async def count_tokens(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    body = await parse_body(request, CountTokensRequest)
    headers = _extras(request, body)
    kronk = kronk_of(request)
    sources = await media_sources(request, body.model, body.media_urls())
    count = await kronk.count_prompt_tokens(
        body.to_core(sources), add_generation_prompt=True, subject=subject_of(request)
    )
    return Response({"input_tokens": count}, headers=headers)


def router() -> Router:
    return Router(
        path="/",
        route_handlers=[create_message, count_tokens],
        # Router-level, so guards' errors on these routes come out in Anthropic's shape too.
        exception_handlers=ANTHROPIC.exception_handlers(),
    )
