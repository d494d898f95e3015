"""Media is cached exactly: conversations with images and sounds against cold replays.

As for text (test_caching.py), a cached run is compared with a cache-less context
that decodes the same chunks: the kept prefix stays in its sequence, the rest is decoded
as the engine decodes it (text up to a media chunk, the chunk's embeddings, text after).
Each test runs on the tiny model with llama.cpp's `gemma3` vision and `ultravox` audio
projector, and on the tiny Qwen2.5-VL with its M-RoPE projector (images only: a second
image of another shape stands in for the sound), where the text after an image sits at
fewer positions than its token index and the cache cuts, copies, saves and restores by
tokens.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kronk_core import Kronk, KronkConfig, Media, ModelConfig
from kronk_core.contract.backend import Batch
from kronk_core.contract.cache import PromptScope
from kronk_core.contract.media import MediaPrompt
from kronk_core.contract.tokens import common_prefix
from kronk_core.contract.types import ChatResult
from kronk_core.prompts import media_of, render_prompt
from kronk_core.runtime.reports import StepRecord
from kronk_llamacpp.media import LlamaMediaModel
from kronk_testing.media_samples import striped, wav
from kronk_testing.plugin import MultimodalPaths, QwenVlPaths
from kronk_testing.replay import ColdReplay, assert_same_first_token, assert_same_logprobs

N_BATCH = 128
SYSTEM = "You describe pictures and sounds for a ship's crew, briefly and precisely. " * 3


@dataclass(frozen=True)
class Projector:
    model: Path
    projector: Path
    sound: bool  # reads sounds too (else a second picture of another shape stands in)
    # The KV positions a media chunk of so many tokens takes, where not as many: Qwen's
    # 8 x 6 and 8 x 4 pictures take max(rows, columns), 8 (what mtmd says, in
    # tests/test_tiny_qwen_vl.py).
    positions: dict[int, int] = field(default_factory=dict)


@pytest.fixture(scope="module", params=["gemma3+ultravox", "qwen2.5vl"])
def projector(request: pytest.FixtureRequest) -> Projector:
    if request.param == "gemma3+ultravox":
        paths: MultimodalPaths = request.getfixturevalue("multimodal_paths")
        return Projector(paths.model, paths.both, sound=True)
    qwen: QwenVlPaths = request.getfixturevalue("qwen_vl_paths")
    return Projector(qwen.model, qwen.vision, sound=False, positions={48: 8, 32: 8})


def mm_config(paths: Projector, **settings: Any) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "model_path": paths.model,
            "projector_path": paths.projector,
            "templates": {"template": "gemma"},
            "context_window": 4096,
            "n_batch": N_BATCH,
            "sampling": {"dry_multiplier": 0.0},
            "draft_strategy": "none",
            **settings,
        }
    )


@pytest.fixture(scope="module")
def kronk(projector: Projector, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kronk]:
    paths = projector
    config = KronkConfig(
        base_path=tmp_path_factory.mktemp("kronk-media-caching"),
        models={
            "imc": mm_config(paths, n_seq_max=2, caching={"host_cache_bytes": 0}),
            # One slot and a host tier in RAM: a second conversation evicts the first.
            "host": mm_config(paths, n_seq_max=1, caching={"host_cache_bytes": 64 << 20}),
            "spc": mm_config(paths, n_seq_max=2, cache="spc"),
            "copy": mm_config(paths, n_seq_max=2, caching={"host_cache_bytes": 0}),
        },
    )
    with Kronk(config) as instance:
        yield instance


class MediaReplay(ColdReplay):
    """ColdReplay for prompts with media: the same projector encodes the chunks anew."""

    def __init__(self, config: ModelConfig) -> None:
        self.model = LlamaMediaModel(config.model_copy(update={"n_seq_max": 1}))
        self.media_model = self.model
        self.tokens = []
        self.logprobs = []
        self._index = 0

    def prefill_media(self, prompt: MediaPrompt, keep: int) -> list[tuple[str, float]]:
        """Keep `keep` tokens; decode the rest in the engine's chunks (one request alone:
        text runs of at most n_batch tokens ending at a media chunk, then the chunk)."""
        tokens = list(prompt.tokens)
        assert self.tokens[:keep] == tokens[:keep]
        self.model.seq_remove(0, keep, -1)
        self.tokens = tokens
        position = keep
        spans = [span for span in prompt.spans if span.end > keep]
        while position < len(tokens):
            span = spans[0] if spans else None
            if span is not None and position >= span.start:
                embeddings = self.media_model.encode_media(span)
                offset = position - span.start
                count = span.length - offset if span.whole else min(N_BATCH, span.length - offset)
                self.media_model.decode_media(embeddings, offset, count, position, 0)
                position += count
                if position == span.end:
                    spans.pop(0)
                continue
            end = min(position + N_BATCH, span.start if span else len(tokens))
            batch = Batch()
            for index in range(position, end):
                batch.add(tokens[index], index, 0, index == len(tokens) - 1)
            self.model.decode(batch)
            position = end
        self._index = len(batch) - 1
        first = self.model.logprobs(self._index, 0, 5).top_logprobs
        return [(t.token, t.logprob) for t in first]


def prompt_of(kronk: Kronk, model: str, messages: Sequence[dict[str, Any]]) -> MediaPrompt:
    loaded = kronk.load(model)
    request = kronk.chat_request(list(messages), model=model)
    scope = PromptScope(remember=False)
    chat = loaded.cache.prompt_messages(request.messages, scope)  # type: ignore[union-attr]
    options = kronk.render_options(request)
    text = render_prompt(loaded, chat, options, request)  # type: ignore[arg-type]
    return loaded.prompt(text, media_of(chat))  # type: ignore[union-attr]


async def ask(kronk: Kronk, model: str, messages: Sequence[dict[str, Any]]) -> ChatResult:
    return await kronk.chat(
        list(messages), model=model, max_tokens=8, temperature=0, logprobs=True, top_logprobs=5
    )


def check_positions(kronk: Kronk, model: str, prompt: MediaPrompt, projector: Projector) -> None:
    """llama.cpp holds the answered conversation at the positions mtmd gives its chunks:
    the replays' tolerance cannot tell positions apart on this random-weight model (a
    position off moves its log-probs by less than 1e-3 nats), so they are read directly,
    after cuts, copies and restores (a state restored by SPC goes through the host tier's
    path, set_seq_state; an SPC slot keeps nothing after its answer to read)."""
    loaded = kronk.load(model)
    assert isinstance(loaded.model, LlamaMediaModel)
    held = [
        s
        for s in loaded.engine.slots
        if common_prefix(s.tokens, prompt.tokens) == len(prompt.tokens)
    ]
    (slot,) = held
    behind = sum(
        span.length - projector.positions.get(span.length, span.length) for span in prompt.spans
    )
    assert loaded.model.kv_positions(slot.seq_id) == (0, len(slot.tokens) - 1 - behind)


def check(result: ChatResult, replay: MediaReplay, prompt: MediaPrompt) -> None:
    """The cached run is the replay's, token for token and log-prob for log-prob."""
    reference = replay.prefill_media(prompt, result.usage.cached_tokens)
    assert_same_first_token(result, reference)
    assert replay.generate(result.usage.completion_tokens) == result.content
    assert_same_logprobs(result, replay)


def picture(shift: int) -> Media:
    """Stripes of one size; `shift` moves them: the same size, other content. (Gemma's
    projector makes 64 tokens of any image, Qwen's 8 x 6 of this one.)"""
    return Media.from_bytes(striped((224, 168), shift))


def sound_or_picture(projector: Projector, pitch: int, seconds: float = 1.0) -> Media:
    """A sound, or on a projector without audio a wide picture (8 x 4 tokens on Qwen's)."""
    if projector.sound:
        return Media.from_bytes(wav(pitch, seconds))
    return Media.from_bytes(striped((224, 112), pitch % 7))


async def test_a_conversation_about_an_image_and_a_sound_matches_cold_replays(
    kronk: Kronk, projector: Projector
) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": ["What is in this picture?", picture(0)]},
    ]
    replay = MediaReplay(kronk.load("imc").config)
    previous = 0
    try:
        for turn in range(4):
            result = await ask(kronk, "imc", messages)
            prompt = prompt_of(kronk, "imc", messages)
            assert result.usage.prompt_tokens == len(prompt.tokens)
            check(result, replay, prompt)
            check_positions(kronk, "imc", prompt, projector)
            if turn:
                # The whole previous prompt, its media included, came from the cache.
                assert result.usage.cached_tokens >= previous > prompt.spans[0].end
            previous = result.usage.prompt_tokens
            messages.append({"role": "assistant", "content": result.content})
            follow = ["And now this?", sound_or_picture(projector, 440, 40.0)] if turn == 1 else []
            messages.append({"role": "user", "content": [f"Tell me more, {turn}.", *follow]})
        # A 40-second sound is two chunks of 150 tokens; on Qwen's projector the second
        # picture is 8 x 4 tokens.
        lengths = [64, 150, 150] if projector.sound else [48, 32]
        assert [span.length for span in prompt.spans] == lengths
    finally:
        replay.close()


async def test_a_changed_image_of_the_same_size_never_reuses_the_old_cells(kronk: Kronk) -> None:
    def conversation(shift: int) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": ["Describe the stripes.", picture(shift)]},
        ]

    replay = MediaReplay(kronk.load("imc").config)
    try:
        first = await ask(kronk, "imc", conversation(0))
        check(first, replay, prompt_of(kronk, "imc", conversation(0)))
        again = await ask(kronk, "imc", conversation(0))
        # Greedy, so reproducible: the repeat keeps the image and decodes the text after it,
        # its prompt's last chunk, again (docs/speculative.md, "Reproducible answers").
        assert again.usage.cached_tokens == prompt_of(kronk, "imc", conversation(0)).spans[0].end
        changed = prompt_of(kronk, "imc", conversation(4))
        image = changed.spans[0]
        original = prompt_of(kronk, "imc", conversation(0))
        # The prompts differ from the image's first position on, and only in the image.
        assert common_prefix(original.tokens, changed.tokens) == image.start
        assert original.tokens[image.end :] == changed.tokens[image.end :]
        other = await ask(kronk, "imc", conversation(4))
        assert other.usage.cached_tokens <= image.start
        check(other, replay, changed)
        ours = {t.token: t.logprob for t in other.logprobs[0].top_logprobs}
        theirs = {t.token: t.logprob for t in first.logprobs[0].top_logprobs}
        assert ours != theirs
    finally:
        replay.close()


async def test_a_shared_prefix_with_an_image_is_copied_to_another_slot(
    kronk: Kronk, projector: Projector
) -> None:
    shared: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": ["Look at this first.", picture(6)]},
        {"role": "assistant", "content": "Stripes."},
    ]
    first = [*shared, {"role": "user", "content": "Agent one asks about the left side."}]
    second = [*shared, {"role": "user", "content": "Agent two asks about the colours."}]
    replay = MediaReplay(kronk.load("copy").config)
    try:
        answer = await ask(kronk, "copy", first)
        check(answer, replay, prompt_of(kronk, "copy", first))
        other = await ask(kronk, "copy", second)
        prompt = prompt_of(kronk, "copy", second)
        counters = kronk.load("copy").engine.cache_counters()  # type: ignore[union-attr]
        assert counters.shared_prefixes == 1
        assert other.usage.cached_tokens > prompt.spans[0].end
        check(other, replay, prompt)
        check_positions(kronk, "copy", prompt, projector)
    finally:
        replay.close()


async def test_the_host_tier_stores_and_restores_a_conversation_with_media(
    kronk: Kronk, projector: Projector
) -> None:
    first: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": ["What is this?", sound_or_picture(projector, 330)]},
    ]
    second = [first[0], {"role": "user", "content": ["And here?", picture(8)]}]
    replay = MediaReplay(kronk.load("host").config)
    try:
        answer = await ask(kronk, "host", first)
        check(answer, replay, prompt_of(kronk, "host", first))
        await ask(kronk, "host", second)  # one slot: the first conversation goes to the host tier
        first += [
            {"role": "assistant", "content": answer.content},
            {"role": "user", "content": "Louder or softer than before?"},
        ]
        restored = await ask(kronk, "host", first)
        prompt = prompt_of(kronk, "host", first)
        assert restored.usage.cached_tokens > prompt.spans[0].end
        counters = kronk.load("host").engine.cache_counters()  # type: ignore[union-attr]
        assert counters.restores >= 1
        replay.move_cells()
        check(restored, replay, prompt)
        check_positions(kronk, "host", prompt, projector)
    finally:
        replay.close()


async def test_spc_keeps_an_image_in_the_system_prompt(kronk: Kronk, tmp_path: Path) -> None:
    system = {"role": "system", "content": [SYSTEM, picture(2)]}
    replay = MediaReplay(kronk.load("spc").config)
    try:
        for turn in range(3):
            messages = [system, {"role": "user", "content": f"Question {turn}: what colour?"}]
            result = await ask(kronk, "spc", messages)
            prompt = prompt_of(kronk, "spc", messages)
            if turn:
                assert result.usage.cached_tokens > prompt.spans[0].end
                # The restored state is turn 0's prefill, cut back to the system prompt.
                replay.prefill_media(
                    prompt_of(
                        kronk,
                        "spc",
                        [system, {"role": "user", "content": "Question 0: what colour?"}],
                    ),
                    0,
                )
            check(result, replay, prompt)
    finally:
        replay.close()
    # A system prompt with an image is not handed to a request that sent none.
    alone = await ask(kronk, "spc", [{"role": "user", "content": "No system prompt here."}])
    assert alone.usage.prompt_tokens < 64


async def test_a_conversation_without_the_image_keeps_only_the_text_before_it(
    kronk: Kronk, projector: Projector
) -> None:
    """One slot: the second conversation shares the first one's text up to its image, and
    then goes on in text. The slot is cut back before the image, and the text after the cut
    lands where a cold run puts it (under M-RoPE: as if the image had never been there)."""
    # Long enough that the text before the image is worth keeping (IMC's 100 tokens).
    question = "The lookout reports from the mast at dawn, all in order. " * 4 + "First: "
    first: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [question, picture(5)]},
    ]
    second = [first[0], {"role": "user", "content": question + "nothing at all, only fog."}]
    replay = MediaReplay(kronk.load("host").config)
    try:
        before = prompt_of(kronk, "host", first)
        check(await ask(kronk, "host", first), replay, before)
        image = before.spans[0]
        answer = await ask(kronk, "host", second)
        prompt = prompt_of(kronk, "host", second)
        assert not prompt.spans
        assert 100 <= answer.usage.cached_tokens <= image.start
        check(answer, replay, prompt)
        check_positions(kronk, "host", prompt, projector)
    finally:
        replay.close()


async def test_two_conversations_with_images_decode_side_by_side(
    kronk: Kronk, projector: Projector
) -> None:
    """Two slots, each with a picture of its own shape, answered at once: each answer is
    its cold replay's, and each sequence holds the positions of its own chunks."""
    conversations = [
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": ["Which way do the stripes run?", media]},
        ]
        for media in (picture(1), sound_or_picture(projector, 550))
    ]
    replays = [MediaReplay(kronk.load("imc").config) for _ in conversations]
    engine = kronk.load("imc").engine
    together = threading.Event()

    def pace(record: StepRecord) -> None:
        # A slot's steps wait a little each until both are in one step, so that a loaded
        # machine's slow encoding of the second picture cannot outlast the first answer.
        if len(record.generating.keys() | record.prefilling.keys()) >= 2:
            together.set()
        elif not together.is_set():
            together.wait(0.5)

    engine.add_step_listener(pace)  # type: ignore[union-attr]
    try:
        before = engine.stats().steps  # type: ignore[union-attr]
        answers = await asyncio.gather(*(ask(kronk, "imc", c) for c in conversations))
        steps = engine.stats().steps - before  # type: ignore[union-attr]
        assert together.is_set()
        # Together: one after another, each would take at least two prompt steps (text, then
        # the picture) and a step per answer token after the first (12-13 steps measured).
        assert steps < sum(answer.usage.completion_tokens + 1 for answer in answers)
        for conversation, answer, replay in zip(conversations, answers, replays, strict=True):
            prompt = prompt_of(kronk, "imc", conversation)
            check(answer, replay, prompt)
            check_positions(kronk, "imc", prompt, projector)
    finally:
        engine.remove_step_listener(pace)  # type: ignore[union-attr]
        for replay in replays:
            replay.close()
