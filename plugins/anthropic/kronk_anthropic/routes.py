"""Anthropic routes: messages (streaming or not) and count_tokens."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from litestar import Request, Response, Router, post
from litestar.response import Stream

from kronk_anthropic.answers import ContentBlocks, message_dict, usage_dict
from kronk_anthropic.errors import ANTHROPIC
from kronk_anthropic.schemas import FIELDS, CountTokensRequest, MessagesRequest
from kronk_anthropic.stream import sse
from kronk_api.contract import client_extras, receive
from kronk_core.contract import ChatDelta, ChatStream, ToolLoop, start_tool_loop, tool_spec

# Grants of the auth guard are per endpoint; both routes belong to "messages".
_OPT = {"kronk_endpoint": "messages"}


@post("/v1/messages", status_code=200, opt=_OPT)
async def create_message(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
    """Anthropic Messages: a conversation in, the model's message out, streamed as Anthropic's
    events with `stream`."""
    received = await receive(request, MessagesRequest)
    body = received.body
    plan, headers = client_extras(request, FIELDS, body)
    chat = body.to_core(received.sources)
    stream: ChatStream | ToolLoop
    if plan.server:
        stream = await start_tool_loop(
            received.kronk, chat, plan.server, max_uses=plan.max_uses, subject=received.subject
        )
    else:
        stream = await received.kronk.start_chat(chat, subject=received.subject)
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
    """Anthropic's token count: the prompt tokens the message request would take, without
    generating."""
    received = await receive(request, CountTokensRequest)
    plan, headers = client_extras(request, FIELDS, received.body)
    chat = received.body.to_core(received.sources)
    # The prompt as /v1/messages starts it: with the server tools offered.
    chat = replace(chat, tools=(*chat.tools, *(tool_spec(tool) for tool in plan.server)))
    count = await received.kronk.count_prompt_tokens(
        chat, add_generation_prompt=True, subject=received.subject
    )
    return Response({"input_tokens": count}, headers=headers)


def router() -> Router:
    return Router(
        path="/",
        route_handlers=[create_message, count_tokens],
        # Router-level, so guards' errors on these routes come out in Anthropic's shape too.
        exception_handlers=ANTHROPIC.exception_handlers(),
    )
