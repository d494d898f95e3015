"""The OpenAI dialect against a real server, through the official `openai` SDK and httpx."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletion

from kronk_llamacpp.packaged import GEMMA_MODEL_ID
from kronk_testing.waiting import gated, wait_until

MODEL = GEMMA_MODEL_ID
PROMPT = "Tell me about cats."
MAX_TOKENS = 8
PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def _messages(prompt: str = PROMPT) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


@pytest.fixture(scope="module")
def client(server: Any) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=server.base_url + "/v1", api_key="none", max_retries=0, timeout=120
    ) as instance:
        yield instance


def _async_client(server: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=server.base_url + "/v1", api_key="none", max_retries=0, timeout=120
    )


def _greedy(client: openai.OpenAI, prompt: str = PROMPT, **params: Any) -> ChatCompletion:
    params.setdefault("max_tokens", MAX_TOKENS)
    return client.chat.completions.create(
        model=MODEL, messages=_messages(prompt), temperature=0, **params
    )


@pytest.fixture(scope="module")
def greedy(client: openai.OpenAI) -> ChatCompletion:
    """One greedy non-streamed answer to PROMPT, shared by the tests that compare with it."""
    return _greedy(client)


# ---- chat completions -------------------------------------------------------


def test_sync_non_streaming(greedy: ChatCompletion) -> None:
    assert greedy.id.startswith("chatcmpl-")
    assert greedy.object == "chat.completion"
    assert greedy.model == MODEL
    assert len(greedy.choices) == 1
    choice = greedy.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert choice.logprobs is None
    usage = greedy.usage
    assert usage is not None
    assert usage.prompt_tokens > 0
    assert 0 < usage.completion_tokens <= MAX_TOKENS
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 0
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 0


async def test_async_streaming_matches_non_streaming(server: Any, greedy: ChatCompletion) -> None:
    async with _async_client(server) as aclient:
        stream = await aclient.chat.completions.create(
            model=MODEL,
            messages=_messages(),
            temperature=0,
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    assert len(chunks) >= 3
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    assert chunks[0].id.startswith("chatcmpl-")
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.delta.role is None for chunk in chunks[1:] for c in chunk.choices)

    usage_chunk, final = chunks[-1], chunks[-2]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert final.choices[0].finish_reason == greedy.choices[0].finish_reason
    assert all(c.finish_reason is None for chunk in chunks[:-2] for c in chunk.choices)
    assert all(chunk.usage is None for chunk in chunks[:-1])

    content = "".join(c.delta.content or "" for chunk in chunks for c in chunk.choices)
    assert content == greedy.choices[0].message.content
    assert greedy.usage is not None
    assert usage_chunk.usage.completion_tokens == greedy.usage.completion_tokens
    assert usage_chunk.usage.prompt_tokens == greedy.usage.prompt_tokens
    assert usage_chunk.usage.total_tokens == greedy.usage.total_tokens


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_token_limit_fields(client: openai.OpenAI, field: str) -> None:
    response = client.chat.completions.create(
        model=MODEL, messages=_messages("hello"), temperature=0, **{field: 5}
    )
    assert response.usage is not None
    assert response.usage.completion_tokens == 5
    assert response.choices[0].finish_reason == "length"


def _stop_candidates(text: str) -> tuple[str, str]:
    """Two distinct substrings of `text` that start past its first character."""
    first = text[len(text) // 3 :][:3]
    second = text[len(text) // 2 :][:4]
    assert first.strip() and second.strip() and first != second, text
    return first, second


def test_stop_string(client: openai.OpenAI, greedy: ChatCompletion) -> None:
    full = greedy.choices[0].message.content or ""
    stop, _ = _stop_candidates(full)
    response = _greedy(client, stop=stop)
    assert response.choices[0].finish_reason == "stop"
    assert response.choices[0].message.content == full[: full.index(stop)]
    assert greedy.usage is not None and response.usage is not None
    assert response.usage.completion_tokens < greedy.usage.completion_tokens


def test_stop_list(client: openai.OpenAI, greedy: ChatCompletion) -> None:
    full = greedy.choices[0].message.content or ""
    first, second = _stop_candidates(full)
    response = _greedy(client, stop=["\x00never\x00", second, first])
    cut = min(full.index(first), full.index(second))
    assert response.choices[0].finish_reason == "stop"
    assert response.choices[0].message.content == full[:cut]


def _check_logprob_entries(entries: list[Any]) -> None:
    for entry in entries:
        assert entry.logprob <= 0.0
        assert isinstance(entry.token, str)
        assert entry.bytes == list(entry.token.encode("utf-8"))
        tops = [top.logprob for top in entry.top_logprobs]
        assert 1 <= len(tops) <= 3
        assert tops == sorted(tops, reverse=True)
        assert all(value <= 0.0 for value in tops)
        assert entry.logprob <= tops[0] + 1e-6


def test_logprobs_non_streamed(client: openai.OpenAI) -> None:
    response = _greedy(client, max_tokens=6, logprobs=True, top_logprobs=3)
    logprobs = response.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert response.usage is not None
    assert len(logprobs.content) == response.usage.completion_tokens
    _check_logprob_entries(logprobs.content)


async def test_logprobs_streamed(server: Any) -> None:
    async with _async_client(server) as aclient:
        stream = await aclient.chat.completions.create(
            model=MODEL,
            messages=_messages(),
            temperature=0,
            max_tokens=6,
            logprobs=True,
            top_logprobs=3,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    entries = [
        entry
        for chunk in chunks
        for choice in chunk.choices
        if choice.logprobs is not None and choice.logprobs.content
        for entry in choice.logprobs.content
    ]
    usage = chunks[-1].usage
    assert usage is not None
    assert len(entries) == usage.completion_tokens > 0
    _check_logprob_entries(entries)


def test_response_format_json_schema(client: openai.OpenAI) -> None:
    response = _greedy(
        client,
        'Reply with {"name": "Al", "age": 3}',
        max_tokens=80,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "p", "schema": PERSON_SCHEMA},
        },
    )
    assert response.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(response.choices[0].message.content or ""), PERSON_SCHEMA)


def test_response_format_json_object(client: openai.OpenAI) -> None:
    response = _greedy(
        client,
        "Give a person as JSON with a name and an age.",
        max_tokens=200,
        response_format={"type": "json_object"},
    )
    assert response.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(response.choices[0].message.content or ""), dict)


# ---- Kronk extensions through extra_body --------------------------------------


def test_grammar_extension(client: openai.OpenAI) -> None:
    response = _greedy(
        client, "Yes or no?", max_tokens=10, extra_body={"grammar": 'root ::= "yes" | "no"'}
    )
    assert response.choices[0].message.content in {"yes", "no"}
    assert response.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("extra", [{"top_k": 1}, {"min_p": 1.0}], ids=["top_k", "min_p"])
def test_truncating_samplers_reduce_to_greedy(
    client: openai.OpenAI, greedy: ChatCompletion, extra: dict[str, Any]
) -> None:
    """Keeping only the most likely token at temperature 1 must reproduce the greedy answer."""
    response = client.chat.completions.create(
        model=MODEL,
        messages=_messages(),
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        seed=7,
        extra_body=extra,
    )
    assert response.choices[0].message.content == greedy.choices[0].message.content


@pytest.fixture(scope="module")
def repetitive(client: openai.OpenAI) -> str:
    """The greedy answer to "hello" repeats itself: a target for the penalties."""
    content = _greedy(client, "hello").choices[0].message.content or ""
    assert content
    return content


@pytest.mark.parametrize(
    "extra",
    [{"repeat_penalty": 10.0}, {"dry_multiplier": 8.0, "dry_allowed_length": 1}],
    ids=["repeat_penalty", "dry_multiplier"],
)
def test_penalties_change_a_repetitive_answer(
    client: openai.OpenAI, repetitive: str, extra: dict[str, Any]
) -> None:
    penalised = _greedy(client, "hello", extra_body=extra)
    assert penalised.choices[0].message.content
    assert penalised.choices[0].message.content != repetitive


def test_xtc_accepted_and_validated(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL,
        messages=_messages(),
        max_tokens=4,
        temperature=1.0,
        seed=3,
        extra_body={"xtc_probability": 1.0, "xtc_threshold": 0.1},
    )
    assert response.usage is not None and response.usage.completion_tokens >= 1
    with pytest.raises(openai.BadRequestError) as info:
        _greedy(client, max_tokens=4, extra_body={"xtc_probability": 1.5})
    assert "xtc_probability" in str(info.value)


@pytest.mark.parametrize(
    "extra",
    [{"top_k": -1}, {"min_p": 1.5}, {"repeat_penalty": -1}, {"dry_multiplier": -0.5}],
    ids=["top_k", "min_p", "repeat_penalty", "dry_multiplier"],
)
def test_extension_ranges_checked(client: openai.OpenAI, extra: dict[str, Any]) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _greedy(client, max_tokens=4, extra_body=extra)
    assert next(iter(extra)) in str(info.value)


@pytest.mark.parametrize("flag", [False, "false", True, "true"])
def test_enable_thinking_forms(client: openai.OpenAI, flag: bool | str) -> None:
    response = _greedy(client, max_tokens=1, extra_body={"enable_thinking": flag})
    assert response.choices[0].message.content


def test_enable_thinking_rejects_other_strings(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _greedy(client, max_tokens=1, extra_body={"enable_thinking": "maybe"})
    assert "enable_thinking" in str(info.value)


# ---- continuing an assistant message (prefill) ---------------------------------

QUESTION = "Write a JSON object with a name and an age."
PREFILL = '{"name": "'
# The default model's template (Gemma 3) around the question: the generation prompt, then
# the continued text; a message not continued is closed and a new turn opened after it.
OPENED = f"<bos><start_of_turn>user\n{QUESTION}<end_of_turn>\n<start_of_turn>model\n"
CONTINUED_PROMPT = OPENED + PREFILL
NEW_TURN_PROMPT = f"{OPENED}{PREFILL}<end_of_turn>\n<start_of_turn>model\n"


def _prefilled(**final: Any) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": PREFILL, **final},
    ]


def raw_tokens(server: Any, text: str) -> int:
    """Tokens of `text` as it stands (special-token text parsed), through /v1/tokenize."""
    response = httpx.post(
        server.base_url + "/v1/tokenize", json={"model": MODEL, "input": text}, timeout=30
    )
    assert response.status_code == 200, response.text
    count = response.json()["tokens"]
    assert isinstance(count, int)
    return count


def test_a_final_assistant_message_is_continued(client: openai.OpenAI, server: Any) -> None:
    answer = client.chat.completions.create(
        model=MODEL, messages=_prefilled(), temperature=0, max_tokens=MAX_TOKENS
    )  # type: ignore[call-overload]
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == raw_tokens(server, CONTINUED_PROMPT)
    content = answer.choices[0].message.content
    assert content and not content.startswith(PREFILL)  # only the continuation comes back
    explicit = client.chat.completions.create(
        model=MODEL, messages=_prefilled(), temperature=0, max_tokens=MAX_TOKENS,
        extra_body={"continue_final_message": True},
    )  # type: ignore[call-overload]  # fmt: skip
    assert explicit.usage is not None
    assert explicit.usage.prompt_tokens == answer.usage.prompt_tokens
    assert explicit.choices[0].message.content == content
    streamed = client.chat.completions.create(
        model=MODEL, messages=_prefilled(), temperature=0, max_tokens=MAX_TOKENS, stream=True
    )  # type: ignore[call-overload]
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed) == content


def test_continue_final_message_false_answers_in_a_new_turn(
    client: openai.OpenAI, server: Any
) -> None:
    answer = client.chat.completions.create(
        model=MODEL, messages=_prefilled(), temperature=0, max_tokens=1,
        extra_body={"continue_final_message": False},
    )  # type: ignore[call-overload]  # fmt: skip
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == raw_tokens(server, NEW_TURN_PROMPT)


def test_a_final_assistant_message_with_a_call_is_not_continued(client: openai.OpenAI) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    answered = client.chat.completions.create(
        model=MODEL, messages=_prefilled(tool_calls=[call]), temperature=0, max_tokens=1
    )  # type: ignore[call-overload]
    assert answered.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="tool calls cannot be continued"):
        client.chat.completions.create(
            model=MODEL, messages=_prefilled(tool_calls=[call]), max_tokens=1,
            extra_body={"continue_final_message": True},
        )  # type: ignore[call-overload]  # fmt: skip


@pytest.mark.parametrize(
    ("messages", "extra", "error"),
    [
        (_messages(), {"continue_final_message": True}, "must be an assistant message, not user"),
        (_prefilled(reasoning_content="Think."), {}, "not its reasoning"),
        (_prefilled(), {"enable_thinking": True}, "cannot be combined with thinking"),
        (
            [{"role": "assistant", "content": PREFILL}],
            {},
            "needs a message before it",
        ),
    ],
    ids=["last_is_user", "reasoning", "thinking", "nothing_before"],
)
def test_what_cannot_be_continued_is_400(
    client: openai.OpenAI, messages: list[dict[str, Any]], extra: dict[str, Any], error: str
) -> None:
    with pytest.raises(openai.BadRequestError, match=error) as info:
        client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=1, extra_body=extra
        )  # type: ignore[call-overload]
    body = info.value.body
    assert isinstance(body, dict)
    assert body["param"] in ("messages", "enable_thinking"), body


# ---- legacy completions (a raw prompt) --------------------------------------------

# PROMPT as the default model's template renders it, minus the BOS the endpoint adds.
RAW_PROMPT = f"<start_of_turn>user\n{PROMPT}<end_of_turn>\n<start_of_turn>model\n"


def _complete(client: openai.OpenAI, **params: Any) -> Any:
    params = {"model": MODEL, "prompt": RAW_PROMPT, "max_tokens": MAX_TOKENS, **params}
    return client.completions.create(temperature=0, **params)


def test_completion_of_a_raw_prompt(
    client: openai.OpenAI, server: Any, greedy: ChatCompletion
) -> None:
    completion = _complete(client)
    assert completion.object == "text_completion"
    assert completion.id.startswith("cmpl-")
    choice = completion.choices[0]
    assert choice.finish_reason == "length"
    assert completion.usage is not None
    # The model's BOS comes first, then the text as it stands (special-token text parsed).
    assert completion.usage.prompt_tokens == raw_tokens(server, RAW_PROMPT) + 1
    assert completion.usage.completion_tokens == MAX_TOKENS
    # The chat template renders exactly this prompt: the same greedy answer.
    assert choice.text.strip() == (greedy.choices[0].message.content or "").strip()
    streamed = _complete(client, stream=True, stream_options={"include_usage": True})
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == MAX_TOKENS


def test_completion_logprobs_echo_and_token_ids(client: openai.OpenAI) -> None:
    completion = _complete(client, logprobs=2)
    choice = completion.choices[0]
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.text_offset is not None
    assert "".join(logprobs.tokens) == choice.text
    assert len(logprobs.tokens) == MAX_TOKENS
    assert all(value <= 0 for value in logprobs.token_logprobs or [])
    assert all(len(top) == 2 for top in logprobs.top_logprobs or [])
    assert logprobs.text_offset[0] == 0
    assert logprobs.text_offset == sorted(logprobs.text_offset)
    echoed = _complete(client, echo=True)
    assert echoed.choices[0].text == RAW_PROMPT + choice.text
    by_ids = client.completions.create(model=MODEL, prompt=[2, 9259], max_tokens=2)
    assert by_ids.usage is not None and by_ids.usage.prompt_tokens == 2  # ids as they are


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"suffix": "tail"}, "suffix: this model has no fill-in-the-middle tokens"),
        ({"best_of": 2, "n": 3}, "best_of: must be at least n"),
        ({"best_of": 2, "stream": True}, "best_of: the best of several candidates cannot be"),
        ({"prompt": ["one", "two"]}, "one prompt per request"),
        ({"echo": True, "logprobs": 1}, "echo with logprobs"),
        ({"prompt": [2, 10_000_000]}, "not in the vocabulary"),
        ({"prompt": ""}, "must not be empty"),
        ({"stop": [""]}, "must not be empty"),
        ({"prompt": "word " * 8300}, "context window"),
    ],
    ids=[
        "suffix",
        "best_of_below_n",
        "best_of_streamed",
        "two_prompts",
        "echo_logprobs",
        "token_out_of_range",
        "empty",
        "empty_stop",
        "too_long",
    ],
)
def test_completion_bad_input_is_400(
    client: openai.OpenAI, params: dict[str, Any], error: str
) -> None:
    with pytest.raises(openai.BadRequestError, match=error):
        _complete(client, **params)


def test_logit_bias_over_http(client: openai.OpenAI, server: Any) -> None:
    loaded = server.kronk.get_loaded()
    (banana,) = loaded.model.tokenize(" banana", add_special=False, parse_special=False)
    forced = _greedy(client, max_tokens=3, logit_bias={str(banana): 100})
    assert forced.choices[0].message.content == " banana" * 3
    completion = _complete(client, max_tokens=3, logit_bias={str(banana): 100})
    assert completion.choices[0].text == " banana" * 3


@pytest.mark.parametrize(
    ("bias", "error"),
    [
        ({"abc": 1}, "token ids"),
        ({"1": 200}, "less than or equal to 100"),
        ({"999999999": 1}, "not in the vocabulary"),
    ],
    ids=["text_key", "out_of_range", "outside_vocabulary"],
)
def test_logit_bias_bad_input_is_400(
    client: openai.OpenAI, bias: dict[str, int], error: str
) -> None:
    with pytest.raises(openai.BadRequestError, match=error):
        _greedy(client, max_tokens=1, logit_bias=bias)
    with pytest.raises(openai.BadRequestError, match=error):
        _complete(client, max_tokens=1, logit_bias=bias)


# ---- models, tokenize, probes -------------------------------------------------


def test_models(client: openai.OpenAI, server: Any) -> None:
    ids = [model.id for model in client.models.list()]
    assert MODEL in ids
    raw = httpx.get(server.base_url + "/v1/models", timeout=30).json()
    assert raw["object"] == "list"
    cards = {card["id"]: card for card in raw["data"]}
    assert cards[MODEL]["loaded"] is True
    assert cards[MODEL]["object"] == "model"
    model = client.models.retrieve(MODEL)
    assert model.id == MODEL
    assert model.owned_by == "kronk"
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("nope")
    assert "nope" in str(info.value)


def test_tokenize(client: openai.OpenAI, server: Any) -> None:
    text = "Count the tokens of this sentence, please."

    def tokens(**extra: Any) -> int:
        response = httpx.post(
            server.base_url + "/v1/tokenize",
            json={"model": MODEL, "input": text, **extra},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["object"] == "tokenize"
        assert body["model"] == MODEL
        count = body["tokens"]
        assert isinstance(count, int)
        return count

    templated = tokens(apply_template=True)
    raw = tokens()
    assert raw > 0
    assert templated > raw
    assert tokens(apply_template=True, add_generation_prompt=False) < templated
    chat = _greedy(client, text, max_tokens=1)
    assert chat.usage is not None
    assert chat.usage.prompt_tokens == templated


def test_tokenize_rejects_unknown_fields(server: Any) -> None:
    response = httpx.post(
        server.base_url + "/v1/tokenize",
        json={"model": MODEL, "input": "x", "bogus": 1},
        timeout=30,
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "bogus"


def test_liveness_and_readiness(server: Any) -> None:
    live = httpx.get(server.base_url + "/v1/liveness", timeout=30)
    assert live.status_code == 200
    body = live.json()
    assert body["status"] == "up"
    assert isinstance(body["version"], str) and body["version"]
    assert isinstance(body["host"], str) and body["host"]
    ready = httpx.get(server.base_url + "/v1/readiness", timeout=30)
    assert ready.status_code == 200
    body = ready.json()
    assert body.pop("load")["slots_total"] >= 1  # the load: tests/test_affinity_drain.py
    assert body == {"status": "ready", "model": MODEL, "model_state": "loaded"}


# ---- concurrency ------------------------------------------------------------------


async def test_concurrent_streams_match_sequential(client: openai.OpenAI, server: Any) -> None:
    """Four streams batched together give each its own sequential greedy answer.

    llama.cpp's CPU kernels are not bit-identical across batch shapes (a prompt
    prefilled next to another one gets logits that differ by up to ~0.7), so a
    near-tie may flip. The comparison is therefore token by token: any divergence
    must be at a near-tie of the sequential run, to the runner-up token.
    DRY is off so that greedy picks the raw argmax that the logprobs describe.
    """
    prompts = ["Tell me about dogs.", "What is 2+2?", "hello there", "Name a color."]
    params: dict[str, Any] = {
        "temperature": 0,
        "max_tokens": 6,
        "logprobs": True,
        "top_logprobs": 2,
        "extra_body": {"dry_multiplier": 0},
    }
    sequential = []
    for prompt in prompts:
        response = client.chat.completions.create(model=MODEL, messages=_messages(prompt), **params)
        logprobs = response.choices[0].logprobs
        assert logprobs is not None and logprobs.content is not None
        sequential.append((response.choices[0].message.content, logprobs.content))

    async def streamed(aclient: openai.AsyncOpenAI, prompt: str) -> tuple[str, list[str]]:
        stream = await aclient.chat.completions.create(
            model=MODEL, messages=_messages(prompt), stream=True, **params
        )
        parts: list[str] = []
        tokens: list[str] = []
        async for chunk in stream:
            for choice in chunk.choices:
                parts.append(choice.delta.content or "")
                if choice.logprobs is not None and choice.logprobs.content:
                    tokens.extend(entry.token for entry in choice.logprobs.content)
        return "".join(parts), tokens

    engine = server.kronk.get_loaded().engine
    widths: list[int] = []

    def listener(record: Any) -> None:
        widths.append(len(record.generating))

    engine.add_step_listener(listener)
    try:
        async with _async_client(server) as aclient:
            # The first stream is held after its first step until the others are queued:
            # however slow the machine, they then share steps.
            before = engine.stats().steps
            with gated(engine, lambda record: record.index > before) as gate:
                first = asyncio.ensure_future(streamed(aclient, prompts[0]))
                await gate.wait_held()
                rest = [asyncio.ensure_future(streamed(aclient, p)) for p in prompts[1:]]
                await wait_until(lambda: engine.stats().queued == len(rest), timeout=60)
            results = await asyncio.gather(first, *rest)
    finally:
        engine.remove_step_listener(listener)
    assert max(widths) >= 2, "the streams were never batched together"

    for prompt, (content, entries), (streamed_content, tokens) in zip(
        prompts, sequential, results, strict=True
    ):
        expected = [entry.token for entry in entries]
        if tokens == expected:
            assert streamed_content == content, prompt
            continue
        pairs = zip(tokens, expected, strict=False)
        mismatches = [i for i, (got, want) in enumerate(pairs) if got != want]
        assert mismatches, (prompt, tokens, expected)
        index = mismatches[0]
        best, runner_up = entries[index].top_logprobs[:2]
        assert best.logprob - runner_up.logprob < 0.5, (prompt, index, tokens, expected)
        assert tokens[index] == runner_up.token, (prompt, index, tokens, expected)
