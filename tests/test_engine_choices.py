"""A request's n choices in the engine, on the default model: they start together, the first
prefills the prompt and the others copy it; when the first goes away before its prompt is in,
or the engine stops, the others are still answered (or told why not)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

from kronk_core import Kronk
from kronk_core.contract.errors import InvalidRequestError, KronkError
from kronk_core.contract.types import FinishReason
from kronk_core.runtime.chat_stream import ChatStream, collect
from kronk_llamacpp.packaged import default_model_path
from kronk_testing.replay import step_records
from kronk_testing.waiting import all_steps_reported, gated, wait_until

if TYPE_CHECKING:
    from kronk_testing.plugin import MakeKronk

pytestmark = pytest.mark.needs_plugins

MODEL = "smollm2"
# About 90 prompt tokens: prefilled in six steps of 16.
LONG = " ".join(f"Item {number} is a small round stone." for number in range(12))
QUESTION = [{"role": "user", "content": f"{LONG}\nWhich item is the largest?"}]
SAMPLED: dict[str, Any] = {"temperature": 1.0, "seed": 3, "max_tokens": 6}


@pytest.fixture
def kronk(make_kronk: MakeKronk) -> Kronk:
    entry = {
        "model_path": str(default_model_path()),
        "context_window": 1024,
        "n_batch": 16,
        "n_seq_max": 3,
        # No cache strategy copies prompts between slots: the engine does, for choices.
        "cache": "none",
        "draft_strategy": "none",
    }
    return make_kronk({MODEL: entry}, load=MODEL, default_model=MODEL)


def engine_of(kronk: Kronk) -> Any:
    loaded = kronk.get_loaded(MODEL)
    assert loaded is not None
    return loaded.engine


async def start(kronk: Kronk, n: int) -> list[ChatStream]:
    return await kronk.start_choices(kronk.chat_request(QUESTION, n=n, **SAMPLED))


async def test_later_choices_go_on_when_the_first_leaves_before_its_prompt_is_in(
    kronk: Kronk,
) -> None:
    engine = engine_of(kronk)
    records = step_records(engine)
    with gated(engine) as gate:  # held after the first prompt chunk
        streams = await start(kronk, 3)
        held = await gate.wait_held()
        assert held.active == 1  # the first choice; the others hold their slots
        assert sum(slot.busy for slot in engine.slots) == 3
        streams[0].cancel()
    first = await collect(streams[0])
    assert first.finish_reason is FinishReason.cancelled
    results = await asyncio.gather(collect(streams[1]), collect(streams[2]))
    assert all(result.finish_reason is FinishReason.length for result in results)
    assert all(result.content for result in results)
    # The second choice prefilled the prompt again, the third copied it from there.
    assert results[0].usage.cached_tokens == 0
    await all_steps_reported(engine, records)
    prefilled: Counter[int] = Counter()
    for record in records[1:]:
        prefilled.update(record.prefilling)
    assert sorted(prefilled.values()) == [1, results[0].usage.prompt_tokens]


async def test_choices_wait_until_they_all_have_a_slot(kronk: Kronk) -> None:
    engine = engine_of(kronk)
    records = step_records(engine)
    with gated(engine, lambda record: bool(record.generating)) as gate:
        alone = asyncio.ensure_future(
            kronk.chat([{"role": "user", "content": "Hi"}], **SAMPLED | {"max_tokens": 3})
        )
        await gate.wait_held()
        streams = await start(kronk, 3)
        await wait_until(lambda: engine.stats().queued == 1)
        assert sum(slot.busy for slot in engine.slots) == 1  # two free, not three
    await alone
    results = await asyncio.gather(*(collect(stream) for stream in streams))
    assert all(result.finish_reason is FinishReason.length for result in results)
    await all_steps_reported(engine, records)
    # The first choice's first generated token shares its step with the others' last prompt
    # token; from then on the three generate together, to their last token.
    together = [record for record in records if len(record.generating) == 3]
    assert len(together) == SAMPLED["max_tokens"] - 2


async def test_an_engine_that_stops_tells_every_choice(kronk: Kronk) -> None:
    engine = engine_of(kronk)
    with gated(engine) as gate:
        streams = await start(kronk, 3)
        await gate.wait_held()
        unloading = asyncio.ensure_future(kronk.aunload(MODEL))
        await wait_until(lambda: not engine.alive)
    await unloading
    for stream in streams:
        with pytest.raises(KronkError, match="unloaded"):
            await collect(stream)


async def test_n_past_the_slots_names_n_seq_max(kronk: Kronk) -> None:
    slots = r"n: 4 choices need as many slots, and smollm2 has 3 \(its n_seq_max\)"
    with pytest.raises(InvalidRequestError, match=slots):
        await start(kronk, 4)
    with pytest.raises(InvalidRequestError, match="start_choices"):
        await kronk.start_chat(kronk.chat_request(QUESTION, n=2))
