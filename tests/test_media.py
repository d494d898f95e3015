"""Images and sounds through the SDK and the engine, on the tiny model's real projectors."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kronk_core import Kronk, KronkConfig, Media, MediaConfig, ModelConfig
from kronk_core.contract.cache import PromptScope
from kronk_core.contract.errors import CapabilityError, MediaError, MediaLimitError
from kronk_core.contract.media import MEDIA_MARKER, MediaKind
from kronk_core.contract.types import ChatResult
from kronk_core.prompts import prepare_chat
from kronk_core.runtime.chat_stream import collect
from kronk_core.runtime.reports import StepRecord
from kronk_testing.media_samples import image, mp3_silence, striped, wav
from kronk_testing.models.multimodal import image_tokens
from kronk_testing.plugin import MultimodalPaths
from kronk_testing.waiting import wait_idle, wait_until

# Small steps, so a sound's 150 tokens are decoded over several of them.
N_BATCH = 64
SOUND_TOKENS = 150


def mm_config(model: Path, projector: Path | None, **settings: Any) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "model_path": model,
            "projector_path": projector,
            "templates": {"template": "gemma"},
            "context_window": 2048,
            "n_seq_max": 2,
            "n_batch": N_BATCH,
            "cache": "none",
            "sampling": {"dry_multiplier": 0.0},
            **settings,
        }
    )


@pytest.fixture(scope="module")
def kronk(
    multimodal_paths: MultimodalPaths, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Kronk]:
    paths = multimodal_paths
    config = KronkConfig(
        base_path=tmp_path_factory.mktemp("kronk-media"),
        media=MediaConfig(max_items=4, max_bytes=2_000_000, max_pixels=1_000_000),
        models={
            "mm": mm_config(paths.model, paths.both),
            "vision": mm_config(paths.model, paths.vision),
            # Any prefix is worth reusing: a cancelled request may keep only the text before
            # its sound, and a loaded machine cancels it there.
            "mm-imc": mm_config(
                paths.model,
                paths.both,
                cache="imc",
                caching={"host_cache_bytes": 0, "cache_min_tokens": 0},
            ),
            "text": mm_config(paths.model, None),
        },
    )
    with Kronk(config) as instance:
        yield instance


async def ask(kronk: Kronk, content: list[Any], model: str = "mm", **extra: Any) -> ChatResult:
    settings = {"max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    return await kronk.chat(
        [{"role": "user", "content": content}], model=model, **{**settings, **extra}
    )


def first_logprobs(result: ChatResult) -> dict[str, float]:
    return {top.token: top.logprob for top in result.logprobs[0].top_logprobs}


async def test_images_and_sounds_count_their_positions(kronk: Kronk, tmp_path: Path) -> None:
    photo = tmp_path / "photo.png"
    photo.write_bytes(image((200, 30, 30)))
    content = [
        "Compare",
        {"type": "image", "path": str(photo)},
        "with",
        Media.from_bytes(wav(440)),
        "and",
        {"type": "image", "data": image((0, 0, 0), fmt="JPEG")},
    ]
    result = await ask(kronk, content)
    request = kronk.chat_request([{"role": "user", "content": content}], model="mm")
    loaded = kronk.get_loaded("mm")
    assert loaded is not None
    generation = prepare_chat(loaded, request, PromptScope(remember=False)).generation
    assert [span.length for span in generation.media] == [
        image_tokens(),
        SOUND_TOKENS,
        image_tokens(),
    ]
    assert [span.kind for span in generation.media] == [
        MediaKind.image,
        MediaKind.audio,
        MediaKind.image,
    ]
    text = loaded.model.tokenize(
        loaded.template.render(request.messages, kronk.render_options(request)).replace(
            MEDIA_MARKER, ""
        ),
        add_special=False,
        parse_special=True,
    )
    # The projector adds <start_of_image> and <end_of_image> around each image.
    assert len(generation.prompt_tokens) == len(text) + 2 * image_tokens() + SOUND_TOKENS + 4
    assert result.usage.prompt_tokens == len(generation.prompt_tokens)
    counted = await kronk.count_prompt_tokens(request, add_generation_prompt=True)
    assert counted == result.usage.prompt_tokens


async def test_the_same_media_answer_the_same_and_other_media_differently(kronk: Kronk) -> None:
    red = await ask(kronk, ["What is it?", Media.from_bytes(image((255, 0, 0)))])
    again = await ask(kronk, ["What is it?", Media.from_bytes(image((255, 0, 0)))])
    blue = await ask(kronk, ["What is it?", Media.from_bytes(image((0, 0, 255)))])
    assert first_logprobs(red) == first_logprobs(again) and red.content == again.content
    assert first_logprobs(red) != first_logprobs(blue)
    low = await ask(kronk, ["Listen", Media.from_bytes(wav(300))])
    high = await ask(kronk, ["Listen", Media.from_bytes(mp3_silence())])
    assert first_logprobs(low) != first_logprobs(high)


async def test_media_in_several_messages(kronk: Kronk) -> None:
    messages = [
        {"role": "user", "content": ["First:", Media.from_bytes(striped())]},
        {"role": "assistant", "content": "Stripes."},
        {
            "role": "user",
            "content": ["And:", Media.from_bytes(wav(660)), Media.from_bytes(image((1, 2, 3)))],
        },
    ]
    result = await kronk.chat(messages, model="mm", max_tokens=3, temperature=0)
    assert result.usage.prompt_tokens > 2 * image_tokens() + SOUND_TOKENS


async def test_a_model_without_projector_or_of_another_kind_refuses(kronk: Kronk) -> None:
    with pytest.raises(CapabilityError, match="has no projector"):
        await ask(kronk, ["Look", Media.from_bytes(image((9, 9, 9)))], model="text")
    with pytest.raises(CapabilityError, match="reads vision input, not audio"):
        await ask(kronk, ["Listen", Media.from_bytes(wav(440))], model="vision")
    assert (await ask(kronk, ["Look", Media.from_bytes(image((9, 9, 9)))], model="vision")).content


async def test_undecodable_media_and_limits_are_refused(kronk: Kronk) -> None:
    broken = image((5, 5, 5))[:40]  # a PNG header with no image data
    with pytest.raises(MediaError, match="could not be decoded"):
        await ask(kronk, ["Look", Media.from_bytes(broken)])
    with pytest.raises(MediaError, match="not an image or sound"):
        await ask(kronk, ["Look", {"type": "image", "data": b"plain text, not a picture"}])
    with pytest.raises(MediaLimitError, match="max_items is 4"):
        await ask(kronk, [Media.from_bytes(image((n, n, n))) for n in range(5)])
    with pytest.raises(MediaLimitError, match="max_pixels is 1000000"):
        await ask(kronk, [Media.from_bytes(image((0, 0, 0), size=(1200, 900)))])
    with pytest.raises(MediaLimitError, match="max_bytes is 2000000"):
        await ask(kronk, [Media.from_bytes(mp3_silence(frames=5000))])


async def test_a_sound_prefills_within_the_step_budget_beside_a_generating_slot(
    kronk: Kronk,
) -> None:
    loaded = kronk.load("mm")
    records: list[StepRecord] = []
    sound_started = threading.Event()

    def pace(record: StepRecord) -> None:
        # The story's steps wait a little each until the sound starts, so that a loaded
        # machine's slow encoding of the sound cannot outlast the story.
        if sum(record.prefilling.values()) >= N_BATCH // 2:
            sound_started.set()
        elif record.generating and not sound_started.is_set():
            sound_started.wait(0.05)

    loaded.engine.add_step_listener(records.append)  # type: ignore[union-attr]
    loaded.engine.add_step_listener(pace)  # type: ignore[union-attr]
    try:
        talker = asyncio.create_task(
            kronk.chat(
                [{"role": "user", "content": "Tell me a story."}],
                model="mm",
                max_tokens=1000,
                temperature=0,
            )
        )
        await wait_until(lambda: any(record.generating for record in records), timeout=60)
        listener = await ask(kronk, ["Listen", Media.from_bytes(wav(523, seconds=50.0, rate=8000))])
        story = await talker
    finally:
        loaded.engine.remove_step_listener(pace)  # type: ignore[union-attr]
        loaded.engine.remove_step_listener(records.append)  # type: ignore[union-attr]
    assert listener.usage.prompt_tokens > 2 * SOUND_TOKENS
    sound_steps = [
        r for r in records if r.generating and sum(r.prefilling.values()) >= N_BATCH // 2
    ]
    assert len(sound_steps) >= 4, "the sound was decoded over several steps beside the story"
    for record in records:
        assert sum(record.prefilling.values()) + sum(record.generating.values()) <= N_BATCH
    assert story.usage.completion_tokens == 1000


async def test_cancelling_midway_through_a_sound_frees_the_slot(kronk: Kronk) -> None:
    loaded = kronk.load("mm-imc")
    records: list[StepRecord] = []
    loaded.engine.add_step_listener(records.append)  # type: ignore[union-attr]
    content = ["Listen", Media.from_bytes(wav(700, seconds=80.0, rate=8000))]
    request = kronk.chat_request([{"role": "user", "content": content}], model="mm-imc")
    spans = prepare_chat(loaded, request, PromptScope(remember=False)).generation.media  # type: ignore[arg-type]
    try:
        stream = await kronk.start_chat(request)
        task = asyncio.create_task(collect(stream))
        # Cancel once part of the first sound chunk is in the slot.
        await wait_until(
            lambda: sum(sum(r.prefilling.values()) for r in records) >= spans[0].start + 20,
            timeout=120,
        )
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_idle(loaded.engine, timeout=60)  # type: ignore[arg-type]
    finally:
        loaded.engine.remove_step_listener(records.append)  # type: ignore[union-attr]
    slots = loaded.engine.slots  # type: ignore[union-attr]
    assert not any(slot.busy for slot in slots)
    # The slot keeps the conversation up to the sound chunk it stopped in, not part of it.
    kept = max(len(slot.tokens) for slot in slots)
    assert kept in [span.start for span in spans] or kept > spans[-1].end
    result = await ask(kronk, content, model="mm-imc", max_tokens=2)
    assert result.usage.cached_tokens == kept


async def test_the_context_check_counts_media_positions(kronk: Kronk) -> None:
    content = ["Listen", Media.from_bytes(wav(400, seconds=35.0, rate=8000))]
    request = kronk.chat_request([{"role": "user", "content": content}], model="mm")
    prompt = await kronk.count_prompt_tokens(request, add_generation_prompt=True)
    assert prompt > 2 * SOUND_TOKENS
    loaded = kronk.get_loaded("mm")
    assert loaded is not None
    asked = kronk.chat_request(
        [{"role": "user", "content": content}], model="mm", max_tokens=2048
    )
    # max_tokens is capped by what the media-counting prompt leaves of the window.
    assert prepare_chat(loaded, asked, PromptScope()).generation.max_tokens == 2048 - prompt
    fits = kronk.chat_request(
        [{"role": "user", "content": content}], model="mm", max_tokens=2048 - prompt
    )
    stream = await kronk.start_chat(fits)  # the check passes; the stream is not needed
    assert stream.prompt_tokens == prompt
    stream.cancel()
