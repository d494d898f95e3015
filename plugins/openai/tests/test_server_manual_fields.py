"""The manual's request fields on chat and raw completions (§9, its parameter tables):
`include_usage` (on by default: usage on a stream's finishing chunk) next to OpenAI's
`stream_options`, and `return_prompt` (the prompt as rendered, in the answer)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from openai import OpenAI

from kronk_llamacpp.packaged import DEFAULT_MODEL_ID

if TYPE_CHECKING:
    from kronk_testing.server import RunningServer

MESSAGES = [{"role": "user", "content": "Say hello."}]


@pytest.fixture
def client(server: RunningServer) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0) as opened:
        yield opened


def frames(server: RunningServer, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", f"{server.base_url}{path}", json=body, timeout=60) as response:
        assert response.status_code == 200
        lines = [line.removeprefix("data: ") for line in response.iter_lines()]
    return [json.loads(line) for line in lines if line.startswith("{")]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": DEFAULT_MODEL_ID, "messages": MESSAGES, "max_tokens": 4, **fields}


def test_a_stream_carries_usage_on_its_finishing_chunk_by_default(
    server: RunningServer, client: OpenAI
) -> None:
    chunks = frames(server, "/v1/chat/completions", chat(stream=True))
    finishing = [chunk for chunk in chunks if chunk["choices"][0]["finish_reason"]]
    assert len(finishing) == 1 and finishing[-1] is chunks[-1]
    assert finishing[0]["usage"]["completion_tokens"] == 4
    assert all("usage" not in chunk for chunk in chunks[:-1])
    assert all(chunk["choices"] for chunk in chunks)  # no chunk without a choice
    # The official SDK reads it, and its stream helper's final completion has the usage.
    streamed = list(client.chat.completions.create(**chat(stream=True)))
    assert streamed[-1].usage is not None and streamed[-1].usage.completion_tokens == 4
    # (The helper refuses an answer cut by max_tokens: this one stops by itself.)
    with client.chat.completions.stream(**chat(max_tokens=256, temperature=0)) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "stop"
    assert final.usage is not None and final.usage.completion_tokens > 0


def test_include_usage_false_and_stream_options(server: RunningServer) -> None:
    quiet = frames(server, "/v1/chat/completions", chat(stream=True, include_usage=False))
    assert all("usage" not in chunk for chunk in quiet)
    # OpenAI's own shape, when asked for: a last chunk without choices, `usage: null` before.
    asked = chat(stream=True, stream_options={"include_usage": True})
    chunks = frames(server, "/v1/chat/completions", asked)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert all(chunk["usage"] is None for chunk in chunks[:-1])
    # stream_options saying no beats the manual's default.
    declined = chat(stream=True, stream_options={"include_usage": False})
    assert all("usage" not in chunk for chunk in frames(server, "/v1/chat/completions", declined))


def test_raw_completions_follow_the_same_rules(server: RunningServer) -> None:
    body = {"model": DEFAULT_MODEL_ID, "prompt": "Once upon", "max_tokens": 3, "stream": True}
    chunks = frames(server, "/v1/completions", body)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 3
    asked = frames(server, "/v1/completions", body | {"stream_options": {"include_usage": True}})
    assert asked[-1]["choices"] == [] and asked[-1]["usage"]["completion_tokens"] == 3
    with_prompt = frames(server, "/v1/completions", body | {"return_prompt": True})
    assert with_prompt[-1]["prompt"] == "Once upon"


def test_return_prompt_gives_the_prompt_as_rendered(server: RunningServer) -> None:
    answer = httpx.post(
        f"{server.base_url}/v1/chat/completions", json=chat(return_prompt=True), timeout=60
    )
    assert answer.status_code == 200
    prompt = answer.json()["prompt"]
    # SmolLM2's ChatML, its default system turn, the message and the generation prompt.
    assert prompt.endswith("<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n")
    count = httpx.post(
        f"{server.base_url}/v1/tokenize",
        json={"model": DEFAULT_MODEL_ID, "input": prompt},
        timeout=60,
    ).json()
    assert answer.json()["usage"]["prompt_tokens"] == count["tokens"]
    chunks = frames(server, "/v1/chat/completions", chat(stream=True, return_prompt=True))
    assert chunks[-1]["prompt"] == prompt
    assert all("prompt" not in chunk for chunk in chunks[:-1])
    plain = httpx.post(f"{server.base_url}/v1/chat/completions", json=chat(), timeout=60)
    assert "prompt" not in plain.json()
