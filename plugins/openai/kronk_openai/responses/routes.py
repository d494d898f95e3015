"""POST /v1/responses (OpenAI's Responses API), GET and DELETE of stored responses."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, delete, get, post
from litestar.params import FromPath
from litestar.response import Stream

from kronk_api.contract import SSE_HEADERS, client_extras, receive, sse_frame, subject_of
from kronk_core.contract import (
    ChatMessage,
    ChatRequest,
    ChatStream,
    ContextOverflowError,
    KronkError,
    ToolLoop,
    ToolLoopEvent,
    start_tool_loop,
)
from kronk_openai.responses.answers import Event, ResponseBuilder
from kronk_openai.responses.errors import RESPONSES_ERRORS
from kronk_openai.responses.schemas import FIELDS, ResponsesRequest, TextFormat
from kronk_openai.responses.store import ResponseStore, StoredResponse

RESPONSES = {"kronk_endpoint": "responses"}


def _store(request: Request[Any, Any, Any]) -> ResponseStore:
    state = request.app.state
    store: ResponseStore | None = state.get("openai_responses")
    if store is None:
        store = state["openai_responses"] = ResponseStore()
    return store


def _skeleton(body: ResponsesRequest, response_id: str, model_id: str) -> dict[str, Any]:
    """The request's settings, echoed in the response object as OpenAI does."""
    text_format = body.text.format if body.text else TextFormat()
    return {
        "id": response_id,
        "model": model_id,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "parallel_tool_calls": body.parallel_tool_calls,
        "previous_response_id": body.previous_response_id,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "tool_choice": body.tool_choice.model_dump(exclude_none=True)
        if body.tool_choice is not None and not isinstance(body.tool_choice, str)
        else body.tool_choice or "auto",
        "tools": [tool.model_dump(exclude_none=True) for tool in body.tools or ()],
        "text": {"format": text_format.model_dump(by_alias=True, exclude_none=True)},
        "reasoning": {"effort": body.reasoning.effort if body.reasoning else None},
        "store": body.store,
        "metadata": body.metadata or {},
    }


@post(
    "/v1/responses",
    status_code=200,
    opt=RESPONSES,
    exception_handlers=RESPONSES_ERRORS.exception_handlers(),
)
async def create_response(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
    """OpenAI Responses: input items in, a response out, streamed as Responses events with `stream`;
    stored for `previous_response_id` unless `store` is false."""
    received = await receive(request, ResponsesRequest)
    body, kronk, owner = received.body, received.kronk, received.subject
    tools, headers = client_extras(request, FIELDS, body)
    store = _store(request)
    history: tuple[ChatMessage, ...] = ()
    if body.previous_response_id is not None:
        history = store.get(body.previous_response_id, owner).conversation
    conversation = (*history, *body.input_messages(received.sources))
    instructions = (
        (ChatMessage(role="system", content=body.instructions),) if body.instructions else ()
    )
    effort = body.reasoning.effort if body.reasoning else None
    chat = ChatRequest(
        messages=(*instructions, *conversation),
        model=body.model,
        sampling=body.sampling(),
        max_tokens=body.max_output_tokens or body.max_tokens,
        json_schema=body.schema_text(),
        enable_thinking=None if effort is None else effort != "none",
        reasoning_effort=body.reasoning.template_effort() if body.reasoning else None,
        tools=tools.specs,
        tool_choice=body.choice(),
        parallel_tool_calls=body.parallel_tool_calls,
    )
    response_id = f"resp_{uuid.uuid4().hex}"
    stream: ChatStream | ToolLoop
    try:
        if tools.server:
            stream = await start_tool_loop(
                kronk, chat, tools.server, max_uses=body.max_uses(tools), subject=owner
            )
        else:
            stream = await kronk.start_chat(chat, subject=owner)
    except ContextOverflowError as exc:
        if not body.stream:
            raise
        # A streamed response fails as OpenAI's do, in the stream: Codex compacts the
        # conversation on a response.failed whose code is context_length_exceeded.
        failed = ResponseBuilder(_skeleton(body, response_id, body.model), tools.targets)
        events = [*failed.start(), *failed.error(exc)]
        frames = [sse_frame(payload, name) for name, payload in events]
        return Stream(frames, media_type="text/event-stream", headers={**SSE_HEADERS, **headers})
    builder = ResponseBuilder(_skeleton(body, response_id, stream.model_id), tools.targets)

    def keep() -> None:
        if body.store:
            # The searches the loop ran are turns of the conversation too.
            turns = stream.turns if isinstance(stream, ToolLoop) else ()
            conversation_out = (*conversation, *turns, builder.assistant_message())
            stored = StoredResponse(builder.response, conversation_out, owner)
            store.put(builder.response["id"], stored)

    answer: Response[Any] | Stream
    if body.stream:
        answer = await RESPONSES_ERRORS.open_stream(
            request, aiter(stream), lambda deltas: _sse(stream, builder, deltas, keep)
        )
    else:
        ran = await RESPONSES_ERRORS.respond(request, _run(builder, aiter(stream)))
        if isinstance(ran, Response):
            return ran
        keep()
        answer = Response(builder.response)
    answer.headers.update(headers)
    return answer


async def _run(builder: ResponseBuilder, deltas: AsyncIterator[ToolLoopEvent]) -> list[Event]:
    events = builder.start()
    async for delta in deltas:
        events += builder.finish(delta) if builder.ends(delta) else builder.feed(delta)
    return events


async def _sse(
    stream: ChatStream | ToolLoop,
    builder: ResponseBuilder,
    deltas: AsyncIterator[ToolLoopEvent],
    keep: Any,
) -> AsyncIterator[bytes]:
    try:
        for name, payload in builder.start():
            yield sse_frame(payload, name)
        async for delta in deltas:
            if builder.ends(delta):
                events = builder.finish(delta)
                keep()
            else:
                events = builder.feed(delta)
            for name, payload in events:
                yield sse_frame(payload, name)
    except KronkError as exc:
        for name, payload in builder.error(exc):
            yield sse_frame(payload, name)
    finally:
        stream.cancel()


@get("/v1/responses/{response_id:str}", opt=RESPONSES)
async def get_response(
    request: Request[Any, Any, Any], response_id: FromPath[str]
) -> dict[str, Any]:
    """A stored response, by id."""
    return _store(request).get(response_id, subject_of(request), param="response_id").body


@delete("/v1/responses/{response_id:str}", status_code=200, opt=RESPONSES)
async def delete_response(
    request: Request[Any, Any, Any], response_id: FromPath[str]
) -> dict[str, Any]:
    """Delete a stored response."""
    _store(request).delete(response_id, subject_of(request), param="response_id")
    return {"id": response_id, "object": "response.deleted", "deleted": True}


RESPONSES_ROUTES = [create_response, get_response, delete_response]
