"""Images and sounds in every dialect, against a real server: the official `openai` and
`anthropic` SDKs, and httpx for what they do not send (plain base64, fetched URLs)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, Media, MediaConfig, ModelConfig
from kronk_testing.file_server import FileServer, Served
from kronk_testing.media_samples import image, mp3_silence, striped, wav
from kronk_testing.models.multimodal import image_tokens
from kronk_testing.plugin import MultimodalPaths
from kronk_testing.server import Serve

MAX_BYTES = 1_000_000
GREEDY = {"temperature": 0}


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclass
class Servers:
    url: str  # fetches http(s) image URLs
    no_fetch_url: str  # does not
    files: FileServer
    kronk: Kronk


def _kronk(base: Path, paths: MultimodalPaths, fetch: bool) -> Kronk:
    settings = {
        "templates": {"template": "gemma"},
        "context_window": 2048,
        "n_seq_max": 2,
        "sampling": {"dry_multiplier": 0.0},
        "draft_strategy": "none",
        "caching": {"cache_min_tokens": 16, "host_cache_bytes": 0},
    }
    return Kronk(
        KronkConfig(
            base_path=base,
            media=MediaConfig(
                max_bytes=MAX_BYTES,
                max_items=3,
                fetch_urls=fetch,
                fetch_timeout=1.0,
                fetch_allow_hosts=["127.0.0.1"],  # the local file server
            ),
            models={
                "mm": ModelConfig.model_validate(
                    {"model_path": paths.model, "projector_path": paths.both, **settings}
                ),
                "text": ModelConfig.model_validate({"model_path": paths.model, **settings}),
            },
        )
    )


@pytest.fixture(scope="module")
def servers(
    multimodal_paths: MultimodalPaths, tmp_path_factory: pytest.TempPathFactory, serve: Serve
) -> Iterator[Servers]:
    base = tmp_path_factory.mktemp("kronk-server-media")
    kronk = _kronk(base, multimodal_paths, fetch=True)
    other = _kronk(base, multimodal_paths, fetch=False)
    with (
        FileServer() as files,
        serve(create_app(ServerSettings(), kronk=kronk)) as url,
        serve(create_app(ServerSettings(), kronk=other)) as no_fetch_url,
    ):
        yield Servers(url, no_fetch_url, files, kronk)


@pytest.fixture(scope="module")
def oai(servers: Servers) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=servers.url + "/v1", api_key="x", max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def claude(servers: Servers) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=servers.url, api_key="x", max_retries=0) as client:
        yield client


def chat(oai: openai.OpenAI, content: Any, model: str = "mm", **extra: Any) -> Any:
    return oai.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": content}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=3,
        **{**GREEDY, **extra},
    )


def first_logprobs(completion: Any) -> dict[str, float]:
    tops = completion.choices[0].logprobs.content[0].top_logprobs
    return {top.token: top.logprob for top in tops}


async def expected_tokens(kronk: Kronk, content: list[Any], model: str = "mm") -> int:
    request = kronk.chat_request([{"role": "user", "content": content}], model=model)
    return await kronk.count_prompt_tokens(request, add_generation_prompt=True)


async def test_openai_chat_takes_images_and_sounds(oai: openai.OpenAI, servers: Servers) -> None:
    picture, sound, song = image((10, 120, 240)), wav(440), mp3_silence()
    completion = chat(
        oai,
        [
            {"type": "text", "text": "Look and listen:"},
            {"type": "image_url", "image_url": {"url": data_url(picture), "detail": "low"}},
            {"type": "input_audio", "input_audio": {"data": b64(sound), "format": "wav"}},
            {"type": "input_audio", "input_audio": {"data": b64(song), "format": "mp3"}},
        ],
    )
    core = ["Look and listen:", Media.from_bytes(picture), Media.from_bytes(sound)]
    expected = await expected_tokens(servers.kronk, [*core, Media.from_bytes(song)])
    assert completion.usage.prompt_tokens == expected > image_tokens() + 2 * 150
    streamed = oai.chat.completions.create(
        model="mm",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_url(picture)}},
                ],
            }
        ],
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    usage = [chunk.usage for chunk in streamed if chunk.usage is not None]
    assert usage[0].prompt_tokens == await expected_tokens(
        servers.kronk, [Media.from_bytes(picture)]
    )


def test_images_in_several_messages_are_cached_by_their_bytes(oai: openai.OpenAI) -> None:
    first = data_url(striped((80, 60), 0))
    messages: list[Any] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "A:"},
                {"type": "image_url", "image_url": {"url": first}},
            ],
        },
        {"role": "assistant", "content": "Stripes."},
        {
            "role": "user",
            "content": [
                {
                    "type": "image_url",
                    "image_url": {"url": data_url(image((1, 1, 1), fmt="GIF"), "image/gif")},
                }
            ],
        },
    ]
    before = oai.chat.completions.create(model="mm", messages=messages, max_tokens=3, **GREEDY)
    messages += [{"role": "assistant", "content": "Dark."}, {"role": "user", "content": "Both?"}]
    after = oai.chat.completions.create(model="mm", messages=messages, max_tokens=3, **GREEDY)
    cached = after.usage.prompt_tokens_details.cached_tokens
    assert cached >= before.usage.prompt_tokens - 1 > 2 * image_tokens()


def test_plain_base64_content_is_found_by_its_magic_bytes(
    oai: openai.OpenAI, servers: Servers
) -> None:
    jpeg = image((250, 250, 0), fmt="JPEG")
    plain = chat(oai, b64(jpeg))
    parts = chat(oai, [{"type": "image_url", "image_url": {"url": data_url(jpeg, "image/jpeg")}}])
    assert plain.usage.prompt_tokens == parts.usage.prompt_tokens > image_tokens()
    assert first_logprobs(plain) == first_logprobs(parts)
    # Text that only looks like base64 stays text.
    text = chat(oai, "SGVsbG8gd29ybGQsIGhvdyBhcmUgeW91Pw==")
    assert text.usage.prompt_tokens < image_tokens()


def test_image_urls_are_fetched_within_limits(oai: openai.OpenAI, servers: Servers) -> None:
    picture = image((40, 200, 90))
    servers.files.routes["/cat.png"] = Served(data=picture, headers={"Content-Type": "image/png"})
    fetched = chat(
        oai, [{"type": "image_url", "image_url": {"url": servers.files.url + "/cat.png"}}]
    )
    inline = chat(oai, [{"type": "image_url", "image_url": {"url": data_url(picture)}}])
    assert first_logprobs(fetched) == first_logprobs(inline)
    servers.files.routes["/huge.bmp"] = Served(data=b"BM" + bytes(MAX_BYTES + 10))
    with pytest.raises(openai.BadRequestError, match="max_bytes"):
        chat(oai, [{"type": "image_url", "image_url": {"url": servers.files.url + "/huge.bmp"}}])
    slow = Served(data=picture, pause_after=10)
    servers.files.routes["/slow.png"] = slow
    try:
        with pytest.raises(openai.BadRequestError, match="fetch_timeout"):
            chat(
                oai, [{"type": "image_url", "image_url": {"url": servers.files.url + "/slow.png"}}]
            )
    finally:
        slow.go.set()
    with pytest.raises(openai.BadRequestError, match="could not fetch"):
        chat(oai, [{"type": "image_url", "image_url": {"url": servers.files.url + "/none.png"}}])


def test_a_server_that_does_not_fetch_says_so(servers: Servers) -> None:
    body = {
        "model": "mm",
        "max_tokens": 2,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": servers.files.url + "/cat.png"}},
                ],
            }
        ],
    }
    response = httpx.post(servers.no_fetch_url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400
    assert "fetch_urls" in response.json()["error"]["message"]


def test_responses_take_input_image(oai: openai.OpenAI, servers: Servers) -> None:
    picture = image((200, 0, 200))
    response = oai.responses.create(
        model="mm",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is it?"},
                    {"type": "input_image", "image_url": data_url(picture), "detail": "auto"},
                ],
            }
        ],
        max_output_tokens=3,
        **GREEDY,
    )
    completion = chat(
        oai,
        [
            {"type": "text", "text": "What is it?"},
            {"type": "image_url", "image_url": {"url": data_url(picture)}},
        ],
    )
    assert response.usage.input_tokens == completion.usage.prompt_tokens > image_tokens()


async def test_anthropic_messages_take_image_blocks(
    claude: anthropic.Anthropic, servers: Servers
) -> None:
    picture = image((0, 90, 60), fmt="JPEG")
    block: Any = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/jpeg", "data": b64(picture)},
    }
    messages: Any = [{"role": "user", "content": [{"type": "text", "text": "Describe:"}, block]}]
    counted = claude.messages.count_tokens(model="mm", messages=messages)
    answer = claude.messages.create(model="mm", max_tokens=3, messages=messages, extra_body=GREEDY)
    usage = answer.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)
    assert counted.input_tokens > image_tokens()
    again = claude.messages.create(
        model="mm",
        max_tokens=3,
        messages=[
            *messages,
            {"role": "assistant", "content": "Green."},
            {"role": "user", "content": [block, {"type": "text", "text": "Sure?"}]},
        ],
        extra_body=GREEDY,
    )
    assert (again.usage.cache_read_input_tokens or 0) > image_tokens()
    # An image in a tool result reaches the model too.
    tool_use: Any = {"type": "tool_use", "id": "call_1", "name": "camera", "input": {}}
    result: Any = {"type": "tool_result", "tool_use_id": "call_1", "content": [block]}
    with_tool = claude.messages.create(
        model="mm",
        max_tokens=3,
        messages=[
            {"role": "user", "content": "Take a photo."},
            {"role": "assistant", "content": [tool_use]},
            {"role": "user", "content": [result]},
        ],
        extra_body=GREEDY,
    )
    assert (
        with_tool.usage.input_tokens + (with_tool.usage.cache_read_input_tokens or 0)
        > image_tokens()
    )


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (
            [{"type": "image_url", "image_url": {"url": data_url(image((1, 2, 3))[:40])}}],
            "could not be decoded",
        ),
        (
            [{"type": "image_url", "image_url": {"url": "data:image/png;base64,%%%"}}],
            "not valid base64",
        ),
        (
            [{"type": "image_url", "image_url": {"url": "ftp://example.com/a.png"}}],
            "data: or http(s)",
        ),
        (
            [{"type": "image_url", "image_url": {"url": data_url(b"no image here", "image/webp")}}],
            "not a readable image",
        ),
        (
            [
                {
                    "type": "input_audio",
                    "input_audio": {"data": b64(image((1, 1, 1))), "format": "wav"},
                }
            ],
            "sent as audio/wav but holds image/png",
        ),
        (
            [{"type": "image_url", "image_url": {"url": data_url(image((0, 0, 0)))}}] * 4,
            "max_items is 3",
        ),
        ([{"type": "file", "file": {"file_id": "file-1"}}], "file parts are not supported"),
    ],
)
def test_bad_media_is_a_400_that_says_why(
    servers: Servers, content: list[Any], fragment: str
) -> None:
    body = {"model": "mm", "max_tokens": 2, "messages": [{"role": "user", "content": content}]}
    response = httpx.post(servers.url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert fragment in response.json()["error"]["message"]


def test_a_model_that_cannot_read_the_media_is_a_400(
    oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    with pytest.raises(openai.BadRequestError, match="has no projector"):
        chat(
            oai,
            [{"type": "image_url", "image_url": {"url": data_url(image((3, 3, 3)))}}],
            model="text",
        )
    block: Any = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": b64(image((3, 3, 3)))},
    }
    with pytest.raises(anthropic.BadRequestError, match="has no projector"):
        claude.messages.create(
            model="text", max_tokens=2, messages=[{"role": "user", "content": [block]}]
        )


@pytest.mark.model
def test_models_list_what_each_model_reads(oai: openai.OpenAI) -> None:
    cards = {card.id: card.model_dump() for card in oai.models.list()}
    assert cards["mm"]["input_modalities"] == ["text", "image", "audio"]
    assert cards["text"]["input_modalities"] == ["text"]
