"""Overlapped decoding (a step's text handed out while the next decode runs) and greedy
sampling on the device (the llamacpp keys `overlap_decode`, `device_sampling`), forced on:
both must give exactly the host engine's answers, log-probs, usage and cache contents.

Self-contained (no conftest fixtures), so the GPU run can point it at another model:
KRONK_OVERLAP_MODEL=model.gguf KRONK_OVERLAP_TEMPLATE=chatml pytest --noconftest ... (see
bench/gpu/run.sh).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest

from kronk_core import FinishReason, Kronk, KronkConfig, LoadedModel, ModelConfig
from kronk_core.contract.sampling import Greedy
from kronk_core.contract.types import ChatResult
from kronk_core.runtime.reports import StepRecord
from kronk_llamacpp.packaged import gemma_model_path
from kronk_llamacpp.sampler import GreedySampler
from kronk_testing.replay import (
    BatchReplay,
    ColdReplay,
    assert_same_first_token,
    assert_same_logprobs,
    prompt_of,
)
from kronk_testing.waiting import all_steps_reported

MODEL = os.environ.get("KRONK_OVERLAP_MODEL")
TEMPLATE = os.environ.get("KRONK_OVERLAP_TEMPLATE", "gemma")
HOST = {"overlap_decode": False, "device_sampling": False}
GPU_LIKE = {"overlap_decode": True, "device_sampling": True}
# Prompt lookup drafting whenever it finds a match: the same batches on every engine.
LOOKUP: dict[str, Any] = {"draft_strategy": "lookup", "speculative": {"adaptive": False}}
PROMPTS = (
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "Monday, Tuesday, Wednesday,",
    "2, 4, 6, 8, 10,",
    "one two three four five",
    "The capital of France is",
    "Knock knock. Who's there?",
)
# A long system prompt, which the conversation's turns are cached behind.
SYSTEM = (
    "You are the ship's computer of the research vessel Kestrel. Answer crew questions about "
    "navigation, weather, cargo and the ship's systems. Be brief and precise. "
) * 6


def config(llamacpp: dict[str, bool], **settings: Any) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "model_path": MODEL or gemma_model_path(),
            "templates": {"template": TEMPLATE},
            "context_window": 1024,
            "n_seq_max": 4,
            "cache": "none",
            "draft_strategy": "none",
            "llamacpp": llamacpp,
            **settings,
        }
    )


@pytest.fixture(scope="module")
def kronk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kronk]:
    imc = {"cache": "imc", "n_seq_max": 2, "caching": {"host_cache_bytes": 0}}
    instance = Kronk(
        KronkConfig(
            base_path=tmp_path_factory.mktemp("kronk-overlap"),
            models_in_cache=8,
            models={
                "host": config(HOST),
                "gpu-like": config(GPU_LIKE),
                "overlap": config({"overlap_decode": True, "device_sampling": False}),
                "device": config({"overlap_decode": False, "device_sampling": True}),
                "host-lookup": config(HOST, **LOOKUP),
                "gpu-like-lookup": config(GPU_LIKE, **LOOKUP),
                "imc-gpu-like": config(GPU_LIKE, **imc),
                # Four slots that keep what they decoded (the batched test reads prompts
                # back from them) and cut nothing shared (prompts below cache_min_tokens).
                "batched": config(GPU_LIKE, **{**imc, "n_seq_max": 4}),
            },
        )
    )
    yield instance
    instance.close()


async def answer(kronk: Kronk, model: str, prompt: str, **params: Any) -> ChatResult:
    return await kronk.chat(
        [{"role": "user", "content": prompt}], model=model, temperature=0, **params
    )


def stop_inside(text: str) -> list[str]:
    """A stop string the answer meets (the two characters at its middle, or earlier where
    they occur earlier: a random-weight model repeats itself); none for a short answer."""
    middle = len(text) // 2
    return [text[middle : middle + 2]] if len(text) >= 4 else []


async def requests(kronk: Kronk, model: str) -> list[ChatResult]:
    """One slot, one request after the other (so every decode is laid out alike): lengths,
    stop strings met mid-answer, log-probs (a device sampler gives the slot back to the
    host), a DRY chain (sampled on the host), then greedy again."""
    results = []
    for prompt in PROMPTS:
        plain = await answer(kronk, model, prompt, max_tokens=16, dry_multiplier=0)
        stop = stop_inside(plain.content)
        results.append(plain)
        results.append(
            await answer(kronk, model, prompt, max_tokens=16, dry_multiplier=0, stop=stop)
        )
        results.append(
            await answer(
                kronk, model, prompt, max_tokens=8, dry_multiplier=0, logprobs=True,
                top_logprobs=3,
            )
        )  # fmt: skip
        results.append(await answer(kronk, model, prompt, max_tokens=8, stop=stop))
    return results


@pytest.fixture(scope="module")
async def host_answers(kronk: Kronk) -> list[ChatResult]:
    answers = await requests(kronk, "host")
    assert sum(r.finish_reason is FinishReason.stop for r in answers) >= 2, "no stop met"
    assert any(r.logprobs for r in answers)
    return answers


def same(ours: ChatResult, theirs: ChatResult, logprobs: bool = True) -> None:
    assert ours.content == theirs.content
    assert ours.finish_reason == theirs.finish_reason
    assert ours.usage.completion_tokens == theirs.usage.completion_tokens
    assert ours.usage.prompt_tokens == theirs.usage.prompt_tokens
    if logprobs:
        assert ours.logprobs == theirs.logprobs


@pytest.mark.parametrize("variant", ["gpu-like", "overlap", "device"])
async def test_answers_equal_the_host_engines(
    kronk: Kronk, host_answers: list[ChatResult], variant: str
) -> None:
    ours = await requests(kronk, variant)
    for theirs, mine in zip(host_answers, ours, strict=True):
        same(mine, theirs)


async def test_speculating_answers_equal_the_host_engines(kronk: Kronk) -> None:
    """Prompt lookup on (drafting whenever it finds a match, so both engines decode the same
    batches): tokens standing from a draft are handed out after the next decode too, and a
    stop string among them drops the rest, exactly as the host engine's usage says."""
    host = await requests(kronk, "host-lookup")
    ours = await requests(kronk, "gpu-like-lookup")
    for theirs, mine in zip(host, ours, strict=True):
        same(mine, theirs)
        assert mine.usage == theirs.usage
    assert sum(r.usage.accepted_prediction_tokens for r in ours) > 0


async def test_batched_streams_match_a_replay_of_their_batches(
    kronk: Kronk, host_answers: list[ChatResult]
) -> None:
    """Twelve requests on four slots: some end on a stop string while the others decode on,
    queued ones take their slots. Every token and log-prob is that of a cache-less replay
    of the same batches, the decodes that ran on after a stop included."""
    loaded = kronk.load("batched")
    assert isinstance(loaded, LoadedModel)
    prompts = [*PROMPTS, *(f"{prompt} Again:" for prompt in PROMPTS)]
    stops = [stop_inside(result.content) for result in host_answers[0::4]] + [[]] * len(PROMPTS)
    records: list[StepRecord] = []
    prefilled: list[dict[int, list[int]]] = []

    def listener(record: StepRecord) -> None:
        # The slots keep their prompts (IMC), also where the request ended in this step.
        slots = loaded.engine.slots
        prefilled.append({i: slots[i].tokens[:n] for i, n in record.prefilling.items()})
        records.append(record)

    loaded.engine.add_step_listener(listener)
    try:
        results = await asyncio.gather(
            *(
                answer(kronk, "batched", prompt, max_tokens=16, dry_multiplier=0, stop=stop,
                       logprobs=True, top_logprobs=5)
                for prompt, stop in zip(prompts, stops, strict=True)
            )
        )  # fmt: skip
        await all_steps_reported(loaded.engine, records)
    finally:
        loaded.engine.remove_step_listener(listener)
    assert sum(r.finish_reason is FinishReason.stop for r in results) >= 2
    assert max(len(record.generating) for record in records) == 4

    # A fresh context with the same slots, decoding the same batches: a slot's next request
    # empties it first, as IMC does with a prompt that shares nothing with it.
    replay = BatchReplay(loaded.config)
    runs: dict[tuple[int, ...], tuple[bytes, list[list[tuple[str, float]]]]] = {}
    running: dict[int, tuple[int, ...]] = {}
    try:
        for record, prefills in zip(records, prefilled, strict=True):
            for slot, tokens in prefills.items():
                assert len(tokens) == record.prefilling[slot], "one chunk per prompt"
                if slot in running:
                    runs[running[slot]] = (replay.text[slot], replay.logprobs[slot])
                running[slot] = tuple(tokens)
                replay.start(slot, tokens, 0)
            replay.step(record)
        for slot, prompt_ids in running.items():
            runs[prompt_ids] = (replay.text[slot], replay.logprobs[slot])
    finally:
        replay.close()
    for prompt, result in zip(prompts, results, strict=True):
        ids = prompt_of(kronk, "batched", [{"role": "user", "content": prompt}])
        text, logprobs = runs[tuple(ids)]
        assert text.startswith(result.content.encode()), prompt
        assert_same_logprobs(result, logprobs[: result.usage.completion_tokens])


async def test_a_conversation_cut_by_stop_strings_caches_exactly(kronk: Kronk) -> None:
    """With overlap, the token whose text met a stop string was decoded already: it stays in
    the slot's KV and record. Each next turn reuses the slot; every answer and log-prob is
    a cold replay's of the same decode layout."""
    model = "imc-gpu-like"
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    replay = ColdReplay(kronk.load(model).config)
    stopped = 0
    try:
        for turn, prompt in enumerate(PROMPTS):
            messages.append({"role": "user", "content": prompt})
            probe = await kronk.chat(messages, model="host", temperature=0, max_tokens=16)
            cached = await kronk.chat(
                messages, model=model, temperature=0, max_tokens=16, logprobs=True,
                top_logprobs=5, stop=stop_inside(probe.content),
            )  # fmt: skip
            prompt_ids = prompt_of(kronk, model, messages)
            if turn:
                assert cached.usage.cached_tokens > 0
            reference = replay.prefill(prompt_ids, cached.usage.cached_tokens)
            assert_same_first_token(cached, reference)
            text = replay.generate(cached.usage.completion_tokens)
            assert_same_logprobs(cached, replay)
            if cached.finish_reason is FinishReason.stop:
                stopped += 1
                assert text.startswith(cached.content) and text != cached.content
                # Prompt and every counted token: the last was decoded as the stop was met.
                slot = next(s for s in kronk.load(model).engine.slots if s.tokens)
                assert len(slot.tokens) == len(prompt_ids) + cached.usage.completion_tokens
                replay.extend(slot.tokens[-1])
            else:
                assert text == cached.content
            messages.append({"role": "assistant", "content": cached.content})
    finally:
        replay.close()
    assert stopped >= 2


def test_both_are_off_unless_asked_for(kronk: Kronk) -> None:
    """Measured on an H100, neither paid at one stream (docs/gpu.md): off by default, on a
    GPU as on a CPU."""
    assert kronk.load("gpu-like").model.info.overlap_decode is True
    plain = Kronk(KronkConfig(models={"m": config({})}))
    try:
        model = plain.load("m").model
        assert model.info.overlap_decode is False
        sampler = model.new_sampler([Greedy()], seq_id=0, logits=False)
        assert type(sampler) is GreedySampler  # the host's argmax, not the device's
        sampler.close()
    finally:
        plain.close()
