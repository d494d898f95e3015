"""Error answers of the real server: status codes, the OpenAI error shape, 429 with Retry-After."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from kronk_core.contract.errors import InvalidRequestError
from kronk_core.contract.types import ChatMessage, ChatRequest
from kronk_llamacpp.packaged import GEMMA_MODEL_ID
from kronk_testing.waiting import gated

MODEL = GEMMA_MODEL_ID
CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hello"}]
CONTEXT = 8192


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MESSAGES, **fields}


def _assert_error_shape(response: httpx.Response) -> dict[str, Any]:
    text = response.text
    assert "Traceback" not in text
    assert 'File "/' not in text
    assert response.headers["content-type"].startswith("application/json"), text
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict)
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert "code" in error
    assert error.get("param") is None or isinstance(error["param"], str)
    return error


@pytest.fixture(scope="module")
def http(server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


# (method, path, request keyword arguments, status, code or None, words the message names)
CASES: dict[str, tuple[str, str, dict[str, Any], int, str | None, tuple[str, ...]]] = {
    "malformed_json": (
        "POST",
        CHAT,
        {
            "content": b'{"model": "x", "messages": [',
            "headers": {"content-type": "application/json"},
        },
        400,
        "invalid_argument",
        ("JSON",),
    ),
    "body_is_a_list": ("POST", CHAT, {"json": [_chat()]}, 400, "invalid_argument", ()),
    "missing_messages": (
        "POST",
        CHAT,
        {"json": {"model": MODEL}},
        400,
        "invalid_argument",
        ("messages",),
    ),
    "missing_model": (
        "POST",
        CHAT,
        {"json": {"messages": MESSAGES}},
        400,
        "invalid_argument",
        ("model",),
    ),
    "empty_messages": (
        "POST",
        CHAT,
        {"json": _chat(messages=[])},
        400,
        "invalid_argument",
        ("messages",),
    ),
    "temperature_wrong_type": (
        "POST",
        CHAT,
        {"json": _chat(temperature="hot")},
        400,
        "invalid_argument",
        ("temperature",),
    ),
    "temperature_too_high": (
        "POST",
        CHAT,
        {"json": _chat(temperature=3)},
        400,
        "invalid_argument",
        ("temperature",),
    ),
    "top_p_zero": ("POST", CHAT, {"json": _chat(top_p=0)}, 400, "invalid_argument", ("top_p",)),
    "top_logprobs_six": (
        "POST",
        CHAT,
        {"json": _chat(logprobs=True, top_logprobs=6)},
        400,
        "invalid_argument",
        ("top_logprobs",),
    ),
    "max_tokens_zero": (
        "POST",
        CHAT,
        {"json": _chat(max_tokens=0)},
        400,
        "invalid_argument",
        ("max_tokens",),
    ),
    "max_tokens_a_string": (
        "POST",
        CHAT,
        {"json": _chat(max_tokens="4")},
        400,
        "invalid_argument",
        ("max_tokens",),
    ),
    "temperature_a_string": (
        "POST",
        CHAT,
        {"json": _chat(temperature="0.5")},
        400,
        "invalid_argument",
        ("temperature",),
    ),
    "stream_a_string": (
        "POST",
        CHAT,
        {"json": _chat(stream="true")},
        400,
        "invalid_argument",
        ("stream",),
    ),
    "completions_max_tokens_a_string": (
        "POST",
        "/v1/completions",
        {"json": {"model": MODEL, "prompt": "hi", "max_tokens": "4"}},
        400,
        "invalid_argument",
        ("max_tokens",),
    ),
    "responses_max_output_tokens_a_string": (
        "POST",
        "/v1/responses",
        {"json": {"model": MODEL, "input": "hi", "max_output_tokens": "4"}},
        400,
        "invalid_argument",
        ("max_output_tokens",),
    ),
    "embeddings_dimensions_a_string": (
        "POST",
        "/v1/embeddings",
        {"json": {"model": "minilm", "input": "hi", "dimensions": "64"}},
        400,
        "invalid_argument",
        ("dimensions",),
    ),
    "rerank_top_n_a_float": (
        "POST",
        "/v1/rerank",
        {"json": {"model": "tiny-reranker", "query": "q", "documents": ["d"], "top_n": 1.0}},
        400,
        "invalid_argument",
        ("top_n",),
    ),
    "empty_grammar": (
        "POST",
        CHAT,
        {"json": _chat(grammar="", max_tokens=4)},
        400,
        "invalid_argument",
        ("grammar", "empty"),
    ),
    "blank_grammar_streamed": (
        "POST",
        CHAT,
        {"json": _chat(grammar="  \n", max_tokens=4, stream=True)},
        400,
        "invalid_argument",
        ("grammar", "empty"),
    ),
    "stop_list_of_five": (
        "POST",
        CHAT,
        {"json": _chat(stop=["a", "b", "c", "d", "e"])},
        400,
        "invalid_argument",
        ("stop",),
    ),
    "n_past_the_slots": (
        "POST",
        CHAT,
        {"json": _chat(n=5)},
        400,
        "invalid_argument",
        ("n", "n_seq_max"),
    ),
    "unknown_role": (
        "POST",
        CHAT,
        {"json": _chat(messages=[{"role": "wizard", "content": "hi"}])},
        400,
        "invalid_argument",
        ("role",),
    ),
    "image_content_part": (
        "POST",
        CHAT,
        {
            "json": _chat(
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is this?"},
                            {
                                "type": "image_url",
                                "image_url": {"url": "data:image/png;base64,AAAA"},
                            },
                        ],
                    }
                ]
            )
        },
        400,
        "invalid_media",
        ("not a readable image",),
    ),
    "logit_bias": (
        "POST",
        CHAT,
        {"json": _chat(logit_bias={"99999999": 5})},
        400,
        "invalid_argument",
        ("logit_bias", "not in the vocabulary"),
    ),
    "invalid_grammar_streamed": (
        "POST",
        CHAT,
        {"json": _chat(stream=True, grammar="root ::= (", max_tokens=4)},
        400,
        "invalid_argument",
        ("grammar",),
    ),
    "unknown_model": (
        "POST",
        CHAT,
        {"json": _chat(model="no-such-model")},
        404,
        "model_not_found",
        ("no-such-model",),
    ),
    "unknown_model_streamed": (
        "POST",
        CHAT,
        {"json": _chat(model="no-such-model", stream=True)},
        404,
        "model_not_found",
        ("no-such-model",),
    ),
    "unknown_path": ("GET", "/v1/nope", {}, 404, None, ()),
    "wrong_method": ("GET", CHAT, {}, 405, None, ()),
    "tokenize_missing_input": (
        "POST",
        "/v1/tokenize",
        {"json": {"model": MODEL}},
        400,
        "invalid_argument",
        ("input",),
    ),
}


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code", "words"),
    list(CASES.values()),
    ids=list(CASES),
)
def test_error_answers(
    http: httpx.Client,
    method: str,
    path: str,
    kwargs: dict[str, Any],
    status: int,
    code: str | None,
    words: tuple[str, ...],
) -> None:
    response = http.request(method, path, **kwargs)
    assert response.status_code == status, response.text
    error = _assert_error_shape(response)
    if code is not None:
        assert error["code"] == code
    for word in words:
        assert word in error["message"], error
    expected_type = {400: "invalid_request_error", 404: "not_found_error"}.get(status)
    if expected_type is not None:
        assert error["type"] == expected_type


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("stop", ["", [""], ["END", ""]], ids=["string", "list", "among_others"])
def test_empty_stop_string_is_400_naming_stop(
    server: Any, stop: str | list[str], stream: bool
) -> None:
    """An empty stop sequence would match everywhere; it is refused, not silently dropped."""
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=2,
            stop=stop,
            stream=stream,
        )
    error = caught.value.body
    assert isinstance(error, dict), error
    assert error["param"] == "stop", error
    assert error["code"] == "invalid_argument", error
    assert error["message"] == "stop: a stop sequence must not be empty", error


async def test_sdk_refuses_an_empty_stop_string(server: Any) -> None:
    kronk = server.kronk
    with pytest.raises(InvalidRequestError, match="stop sequence must not be empty") as caught:
        await kronk.chat(MESSAGES, stop=[""], max_tokens=2)
    assert caught.value.param == "stop"
    request = ChatRequest(messages=(ChatMessage(role="user", content="hi"),), stop=("",))
    with pytest.raises(InvalidRequestError, match="stop sequence must not be empty"):
        await kronk.start_chat(request)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_context_overflow(http: httpx.Client, stream: bool) -> None:
    """A prompt that does not fit is refused before any byte is streamed."""
    messages = [{"role": "user", "content": "word " * 8300}]
    response = http.post(CHAT, json=_chat(messages=messages, max_tokens=10, stream=stream))
    assert response.status_code == 400, response.text
    error = _assert_error_shape(response)
    assert error["code"] == "context_length_exceeded"
    assert error["type"] == "invalid_request_error"
    assert str(CONTEXT) in error["message"]
    assert "in the prompt" in error["message"]


def test_max_tokens_past_the_window_generates(http: httpx.Client) -> None:
    """Claude Code asks for max_tokens 32000 whatever the model: not an error, a cap."""
    response = http.post(CHAT, json=_chat(max_tokens=32000, temperature=0, stop=[".", "\n"]))
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] > 0


def test_unknown_route_shapes(http: httpx.Client) -> None:
    response = http.delete("/v1/models")
    assert response.status_code == 405
    error = _assert_error_shape(response)
    assert error["code"] == "405"


# ---- queue full ---------------------------------------------------------------


def _engine(server: Any) -> Any:
    return server.kronk.get_loaded().engine


def _idle(engine: Any) -> bool:
    stats = engine.stats()
    return stats.active == 0 and stats.queued == 0 and not any(s.busy for s in engine.slots)


async def _wait_for(condition: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.05)
    return bool(condition())


async def _hold_stream(client: httpx.AsyncClient, prompt: str) -> None:
    """A long streamed generation that reads until it is cancelled."""
    payload = _chat(
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        max_tokens=2000,
        stream=True,
    )
    async with client.stream("POST", CHAT, json=payload) as response:
        async for _ in response.aiter_raw():
            pass


async def test_queue_full_answers_429(server: Any) -> None:
    """Every slot busy and the queue full: a request waits queue_wait_seconds, then 429.

    The engine is held in a step while all slots generate, so nothing finishes or leaves
    the queue, whatever the machine's speed."""
    engine = _engine(server)
    assert await _wait_for(lambda: _idle(engine), 10), engine.stats()
    slots = len(engine.slots)
    capacity = slots * server.kronk.get_loaded().config.queue_depth
    assert (slots, capacity) == (4, 8)
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=0)
    timeout = httpx.Timeout(120, connect=10)
    tasks: list[asyncio.Task[None]] = []
    client = httpx.AsyncClient(base_url=server.base_url, timeout=timeout, limits=limits)
    async with client:
        with gated(engine, lambda record: len(record.generating) == slots) as gate:
            try:
                for index in range(slots):
                    prompt = f"Story {index} about a dragon."
                    tasks.append(asyncio.create_task(_hold_stream(client, prompt)))
                await gate.wait_held()
                for index in range(capacity):
                    tasks.append(
                        asyncio.create_task(_hold_stream(client, f"Queued story {index}."))
                    )
                assert await _wait_for(lambda: engine.stats().queued == capacity, 60)
                assert engine.stats().active == slots

                started = time.monotonic()
                response = await client.post(CHAT, json=_chat(max_tokens=4))
                waited = time.monotonic() - started

                assert response.status_code == 429, response.text
                error = _assert_error_shape(response)
                assert error["code"] == "queue_full"
                assert error["type"] == "rate_limit_error"
                assert all(not task.done() for task in tasks), [t for t in tasks if t.done()]
                # The app was created with ServerSettings(queue_wait_seconds=2.0): the 429
                # says so in Retry-After, and came no sooner (the server's own deadline).
                assert response.headers.get("retry-after") == "2"
                assert waited >= 2.0, waited
            finally:
                gate.release()
                for task in tasks:
                    task.cancel()
                for task in tasks:
                    with contextlib.suppress(BaseException):
                        await task
    # Every closed stream must be released, the queued ones included.
    assert await _wait_for(lambda: _idle(engine), 60), (
        engine.stats(),
        [slot.busy for slot in engine.slots],
    )


# Every dialect's routes that name a model, with a body each accepts but for the model.
UNKNOWN_MODEL_REQUESTS = {
    "chat": (CHAT, {"messages": MESSAGES}),
    "chat_streamed": (CHAT, {"messages": MESSAGES, "stream": True}),
    "completions": ("/v1/completions", {"prompt": "hi"}),
    "responses": ("/v1/responses", {"input": "hi"}),
    "responses_streamed": ("/v1/responses", {"input": "hi", "stream": True}),
    "embeddings": ("/v1/embeddings", {"input": "hi"}),
    "rerank": ("/v1/rerank", {"query": "q", "documents": ["d"]}),
    "tokenize": ("/v1/tokenize", {"input": "hi"}),
}


def _names_the_models_and_the_pull_command(message: str) -> None:
    assert "'no-such-model' not found" in message, message
    for model_id in (MODEL, "minilm", "tiny-reranker"):  # what the session's server has
        assert model_id in message, message
    assert "kronk model pull" in message and "kronk catalog pull" in message, message


@pytest.mark.parametrize(
    ("path", "fields"), list(UNKNOWN_MODEL_REQUESTS.values()), ids=list(UNKNOWN_MODEL_REQUESTS)
)
def test_an_unknown_model_is_a_404_naming_the_models_and_the_pull_command(
    http: httpx.Client, path: str, fields: dict[str, Any]
) -> None:
    response = http.post(path, json={"model": "no-such-model", **fields})
    assert response.status_code == 404, response.text
    error = _assert_error_shape(response)
    assert (error["code"], error["type"], error["param"]) == (
        "model_not_found",
        "not_found_error",
        "model",
    )
    _names_the_models_and_the_pull_command(error["message"])
    card = http.get("/v1/models/no-such-model")
    assert card.status_code == 404
    _names_the_models_and_the_pull_command(_assert_error_shape(card)["message"])


def test_an_unknown_model_through_the_official_sdks(server: Any) -> None:
    """The same message in OpenAI's and in Anthropic's error shape, as their clients read it."""
    chat = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as refused:
        chat.chat.completions.create(model="no-such-model", messages=MESSAGES)  # type: ignore[arg-type]
    _names_the_models_and_the_pull_command(refused.value.message)
    messages = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as missing:
        messages.messages.create(model="no-such-model", max_tokens=4, messages=MESSAGES)  # type: ignore[arg-type]
    body = missing.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "not_found_error"
    _names_the_models_and_the_pull_command(body["error"]["message"])
