"""Anthropic routes: messages (streaming or not) and count_tokens."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from litestar import Request, Response, Router, post
from litestar.response import Stream

from kronk_anthropic.errors import ANTHROPIC
from kronk_anthropic.responses import ContentBlocks, message_dict, usage_dict
from kronk_anthropic.schemas import (
    FIELDS,
    Conversation,
    CountTokensRequest,
    MessagesRequest,
    ToolPlan,
)
from kronk_anthropic.stream import sse
from kronk_api.contract import (
    kronk_of,
    media_sources,
    omitted_tools,
    parse_body,
    served_tools,
    server_tools,
    subject_of,
    unknown_fields,
)
from kronk_core.contract import ChatDelta, ChatStream, ToolLoop, start_tool_loop, tool_spec

# Grants of the auth guard are per endpoint; both routes belong to "messages".
_OPT = {"kronk_endpoint": "messages"}


def _extras(request: Request[Any, Any, Any], body: Conversation) -> tuple[ToolPlan, dict[str, str]]:
    """What the request holds beyond what Kronk serves, logged once: the server tools that
    serve its defined tools, and the response headers that name the tools left out."""
    unknown_fields(request, FIELDS, body.model_extra or {})
    plan = body.tool_plan(server_tools(request))
    served_tools(request, "anthropic", plan.served)
    return plan, omitted_tools(request, "anthropic", plan.omitted)


@post("/v1/messages", status_code=200, opt=_OPT)
async def create_message(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
    body = await parse_body(request, MessagesRequest)
    plan, headers = _extras(request, body)
    kronk = kronk_of(request)
    sources = await media_sources(request, body.model, body.media_urls())
    chat = body.to_core(sources)
    stream: ChatStream | ToolLoop
    if plan.server:
        stream = await start_tool_loop(
            kronk, chat, plan.server, max_uses=plan.max_uses, subject=subject_of(request)
        )
    else:
        stream = await kronk.start_chat(chat, subject=subject_of(request))
    message_id = f"msg_{uuid.uuid4().hex}"
    web_search = bool(plan.server)
    if body.stream:
        answer: Response[Any] | Stream = await ANTHROPIC.open_stream(
            request,
            aiter(stream),
            lambda deltas: sse(
                message_id, stream.model_id, stream.prompt_tokens, deltas, web_search
            ),
        )
    else:
        whole = await ANTHROPIC.respond(request, _answer(stream, message_id, web_search))
        answer = whole if isinstance(whole, Response) else Response(whole)
    answer.headers.update(headers)
    return answer


async def _answer(
    stream: ChatStream | ToolLoop, message_id: str, web_search: bool
) -> dict[str, Any]:
    blocks = ContentBlocks()
    last: ChatDelta | None = None
    async for delta in stream:
        blocks.feed(delta)
        if isinstance(delta, ChatDelta) and delta.finish_reason is not None:
            last = delta
    blocks.close()
    assert last is not None and last.usage is not None
    usage = usage_dict(last.usage, blocks.web_searches if web_search else None)
    return message_dict(message_id, stream.model_id, blocks.content, last, usage)


@post("/v1/messages/count_tokens", status_code=200, opt=_OPT)
async def count_tokens(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    body = await parse_body(request, CountTokensRequest)
    plan, headers = _extras(request, body)
    kronk = kronk_of(request)
    sources = await media_sources(request, body.model, body.media_urls())
    chat = body.to_core(sources)
    # The prompt as /v1/messages starts it: with the server tools offered.
    chat = replace(chat, tools=(*chat.tools, *(tool_spec(tool) for tool in plan.server)))
    count = await kronk.count_prompt_tokens(
        chat, add_generation_prompt=True, subject=subject_of(request)
    )
    return Response({"input_tokens": count}, headers=headers)


def router() -> Router:
    return Router(
        path="/",
        route_handlers=[create_message, count_tokens],
        # Router-level, so guards' errors on these routes come out in Anthropic's shape too.
        exception_handlers=ANTHROPIC.exception_handlers(),
    )
