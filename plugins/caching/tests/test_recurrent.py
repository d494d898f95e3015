"""Models whose state cannot be cut back, on real recurrent GGUFs: the hybrid LFM2
(short-convolution layers beside attention) and the state-space Mamba-2, tiny and with
random weights (scripts/make_tiny_recurrent.py).

llama.cpp updates a recurrent state in place with every token, so a sequence can only
grow or be cleared. IMC keeps such a conversation by extending it, and goes back through
the snapshots (checkpoints) it took at the end of each prompt where a new prompt leaves
the sequence. Exactness is proved as in test_caching.py, against a cold context that
decodes the same chunks; a recurrent reference cannot be cut either, so it is rebuilt
from nothing, chunk by chunk, for every turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kronk_core import Kronk, KronkConfig, LoadedModel, ModelConfig
from kronk_core.contract.cache import CacheCounters
from kronk_core.contract.errors import ConfigError, KronkError
from kronk_core.contract.types import ChatResult
from kronk_testing.conversations import (
    AGENT_SYSTEMS,
    MAX_TOKENS,
    SYSTEM,
    ask,
    conversation,
    prompt_tokens,
    slot_of,
    user_turn,
)
from kronk_testing.models import TINY_LFM2, TINY_LFM2_SWA
from kronk_testing.models.recurrent import LFM2_ATTENTION, LFM2_HEAD, LFM2_HEAD_KV, N_EMBD
from kronk_testing.replay import (
    BatchReplay,
    ColdReplay,
    Start,
    assert_same_first_token,
    assert_same_logprobs,
    step_records,
)
from kronk_testing.waiting import gated, wait_until

# DRY off: greedy is then a pure argmax, which the cold replays reproduce. Speculation is
# left to its default, which must be off for these models (the replays decode one token
# per step).
BASE: dict[str, Any] = {
    "templates": {"template": "gemma"},
    "context_window": 2048,
    "sampling": {"dry_multiplier": 0.0},
    "n_seq_max": 1,
}
NO_HOST_TIER = {"host_cache_bytes": 0}


def model_config(path: Path, **settings: Any) -> ModelConfig:
    return ModelConfig.model_validate({"model_path": path, **BASE, **settings})


def loaded_kronk(path: Path, tmp_path: Path, **settings: Any) -> Kronk:
    kronk = Kronk(KronkConfig(base_path=tmp_path, models={"m": model_config(path, **settings)}))
    kronk.load("m")
    return kronk


def loaded(kronk: Kronk) -> LoadedModel:
    model = kronk.get_loaded("m")
    assert isinstance(model, LoadedModel)
    return model


def counters(kronk: Kronk) -> CacheCounters:
    return loaded(kronk).engine.cache_counters()


def assert_replayed(result: ChatResult, replay: ColdReplay, reference: list[Any]) -> None:
    """The answer is the replay's token for token: the first token's top-5 log-probs are
    `reference` (from the replay's last prefill), then every token's as the replay
    generates greedily."""
    assert_same_first_token(result, reference)
    assert replay.generate(MAX_TOKENS) == result.content
    assert_same_logprobs(result, replay)


def rebuild(replay: ColdReplay, prompt: Sequence[int], ends: Sequence[int]) -> list[Any]:
    """Decode `prompt` into an empty replay in chunks that end at `ends`, then to its end:
    the chunks the slot's state was computed in. The last chunk's top-5 log-probs."""
    assert replay.model.seq_remove(0, 0, -1)
    replay.tokens = []
    start, first = 0, []
    for end in [*ends, len(prompt)]:
        first = replay.prefill(list(prompt[:end]), start)
        start = end
    return first


async def test_it_answers_and_reports_state_that_cannot_be_cut(
    tmp_path: Path, recurrent_path: Path
) -> None:
    """It loads and answers; the backend says its state cannot be cut, and llama.cpp
    indeed refuses a cut, leaving the state whole; prompt lookup, the default
    speculation, stays off (it has to drop rejected guesses from the state), a sliding
    window on the attention layers beside the recurrent ones notwithstanding."""
    kronk = loaded_kronk(recurrent_path, tmp_path)
    try:
        model = loaded(kronk)
        assert model.info.recurrent and not model.info.kv_trimmable
        assert (model.info.n_swa > 0) == (recurrent_path.name == TINY_LFM2_SWA)
        # Only attention layers keep KV: K and V of each head, in f16.
        attention = sum(LFM2_ATTENTION) if recurrent_path.name.startswith("tiny-lfm2") else 0
        per_layer = LFM2_HEAD_KV * 2 * (N_EMBD // LFM2_HEAD) * 2
        assert model.info.kv_bytes_per_token == attention * per_layer
        assert model.engine.draft_strategy is None
        result = await ask(kronk, "m", conversation(SYSTEM, 1))
        assert result.usage.completion_tokens == MAX_TOKENS and result.content.strip()
        (slot,) = model.engine.slots
        length = len(slot.tokens)
        assert length == result.usage.prompt_tokens + MAX_TOKENS - 1  # the last is not decoded
        assert model.model.trim_floor(slot.seq_id) == length
        assert not model.model.seq_remove(slot.seq_id, length - 4, -1)
        assert model.model.trim_floor(slot.seq_id) == length
    finally:
        kronk.close()


@pytest.mark.parametrize("strategy", ["lookup", "draft"])
def test_a_named_draft_strategy_is_refused(
    tmp_path: Path, recurrent_path: Path, strategy: str
) -> None:
    speculation: dict[str, Any] = {"draft_strategy": strategy}
    if strategy == "draft":
        speculation["speculative"] = {"model-id": "m"}
    config = KronkConfig(
        base_path=tmp_path, models={"m": model_config(recurrent_path, **speculation)}
    )
    with Kronk(config) as kronk, pytest.raises(KronkError) as raised:
        kronk.load("m")
    assert isinstance(raised.value, ConfigError)
    assert raised.value.key == "models.m.draft_strategy"
    assert "recurrent state that cannot be cut back" in raised.value.message


def test_a_recurrent_draft_model_is_refused(
    tmp_path: Path, gemma_path: str, recurrent_models: dict[str, Path]
) -> None:
    """Gemma 3 with the tiny LFM2 (its tokenizer is Gemma's) as its draft model."""
    config = KronkConfig(
        base_path=tmp_path,
        models={
            "m": model_config(
                Path(gemma_path), draft_strategy="draft", speculative={"model-id": "lfm2"}
            ),
            "lfm2": model_config(recurrent_models[TINY_LFM2]),
        },
    )
    with Kronk(config) as kronk, pytest.raises(ConfigError) as raised:
        kronk.load("m")
    assert raised.value.key == "models.m.speculative.model_id"
    assert "'lfm2' keeps state that cannot be cut back" in raised.value.message


async def test_a_prompt_that_extends_the_state_continues_it_exactly(
    tmp_path: Path, recurrent_path: Path
) -> None:
    """Nothing to cut: the prompt holds the whole sequence, generated tokens included (a
    raw completion sends back the tokens it got), and only what follows is decoded, token
    for token what a cold context decoding the same chunks gives."""
    kronk = loaded_kronk(recurrent_path, tmp_path, caching=NO_HOST_TIER)
    replay = ColdReplay(model_config(recurrent_path))
    try:
        messages = conversation(SYSTEM, 1)
        first = await ask(kronk, "m", messages)
        replay.prefill(await prompt_tokens(kronk, messages), 0)
        assert replay.generate(MAX_TOKENS) == first.content
        (slot,) = loaded(kronk).engine.slots
        assert replay.tokens == slot.tokens
        more = await kronk.tokenize("\nGo on, and then list the figures again.", model="m")
        prompt = [*slot.tokens, *more]
        second = await kronk.complete(
            prompt, model="m", max_tokens=MAX_TOKENS, temperature=0, logprobs=True, top_logprobs=5
        )
        assert second.usage.cached_tokens == len(replay.tokens)
        assert (counters(kronk).hits, counters(kronk).checkpoint_restores) == (1, 0)
        reference = replay.prefill(prompt, second.usage.cached_tokens)
        assert_replayed(second, replay, reference)
    finally:
        replay.close()
        kronk.close()


async def test_each_turn_goes_back_to_the_snapshot_at_its_last_prompt(
    tmp_path: Path, recurrent_path: Path
) -> None:
    """The client sends back its own text for each answer (as clients that strip or
    reformat answers do): the new prompt leaves the state inside the generated answer,
    where it cannot be cut. IMC restores the snapshot taken at the end of the last
    prompt and prefills from there."""
    kronk = loaded_kronk(recurrent_path, tmp_path, caching=NO_HOST_TIER)
    replay = ColdReplay(model_config(recurrent_path))
    ends: list[int] = []  # where each turn's prompt ended: the chunks of the state
    try:
        messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
        for turn in range(4):
            messages.append(user_turn(turn))
            prompt = await prompt_tokens(kronk, messages)
            result = await ask(kronk, "m", messages)
            assert result.usage.cached_tokens == (ends[-1] if ends else 0)
            assert counters(kronk).checkpoint_restores == turn
            reference = rebuild(replay, prompt, ends)
            assert_replayed(result, replay, reference)
            ends.append(len(prompt))
            messages.append({"role": "assistant", "content": f"Answer {turn}: noted."})
        assert counters(kronk).rebuilds == 1
    finally:
        replay.close()
        kronk.close()


async def test_edits_go_back_to_an_earlier_snapshot_or_rebuild(
    tmp_path: Path, recurrent_path: Path
) -> None:
    """After three turns: the same request again (its last prompt token must be decoded
    again: the snapshot at its end is one token too late, the one before serves), an edit
    of the last question (back to the snapshot before it), an edit of the first question
    (no snapshot before it: rebuilt). Each as a cold context decoding the same chunks."""
    kronk = loaded_kronk(recurrent_path, tmp_path, caching=NO_HOST_TIER)
    replay = ColdReplay(model_config(recurrent_path))
    try:
        ends = []
        for turns in (1, 2, 3):
            messages = conversation(SYSTEM, turns)
            await ask(kronk, "m", messages)
            ends.append(len(await prompt_tokens(kronk, messages)))
        edited_last = conversation(SYSTEM, 3)
        edited_last[-1] = {"role": "user", "content": "Turn 2: something else entirely."}
        edited_first = conversation(SYSTEM, 3)
        edited_first[1] = {"role": "user", "content": "Turn 0: something else entirely."}
        for messages, chunks in [
            (conversation(SYSTEM, 3), ends[:2]),
            (edited_last, ends[:2]),
            (edited_first, []),
        ]:
            result = await ask(kronk, "m", messages)
            assert result.usage.cached_tokens == (chunks[-1] if chunks else 0)
            reference = rebuild(replay, await prompt_tokens(kronk, messages), chunks)
            assert_replayed(result, replay, reference)
        done = counters(kronk)
        assert (done.checkpoint_restores, done.rebuilds) == (4, 2)
    finally:
        replay.close()
        kronk.close()


@pytest.mark.parametrize("tier", ["ram", "disk"])
async def test_a_stored_conversation_comes_back_through_its_snapshot(
    tmp_path: Path, recurrent_path: Path, tier: str
) -> None:
    """Evicted to the host tier by another conversation (on disk: then the server
    restarts), the conversation continues with the client's own text for its answer: its
    state is restored and goes back through the snapshot stored with it."""
    on_disk = {"host_cache_bytes": 0, "host_cache_dir": tmp_path / "kv"}  # no copy in RAM
    caching = on_disk if tier == "disk" else {"host_cache_bytes": 1 << 30}
    kronk = loaded_kronk(recurrent_path, tmp_path, caching=caching)
    replay = ColdReplay(model_config(recurrent_path))
    try:
        first_turn = conversation(AGENT_SYSTEMS[0], 1)
        await ask(kronk, "m", first_turn)
        first_end = len(await prompt_tokens(kronk, first_turn))
        await ask(kronk, "m", conversation(AGENT_SYSTEMS[1], 1))  # evicts the first
        assert counters(kronk).evictions == 1
        if tier == "disk":
            kronk.close()
            kronk = loaded_kronk(recurrent_path, tmp_path, caching=caching)
        second_turn = conversation(AGENT_SYSTEMS[0], 2)  # the client's text for the answer
        restored = await ask(kronk, "m", second_turn)
        done = counters(kronk)
        assert (done.restores, done.checkpoint_restores) == (1, 1)
        assert restored.usage.cached_tokens == first_end
        prompt = await prompt_tokens(kronk, second_turn)
        rebuild(replay, prompt[:first_end], [])
        # Restored, then cut through the snapshot: a hybrid's window cells then lie in
        # other cells than where they were computed (rounding differs): move the
        # replay's the same way.
        replay.move_cells()
        assert replay.model.restore_checkpoint(0, first_end, replay.model.checkpoint(0))
        reference = replay.prefill(prompt, first_end)
        assert_replayed(restored, replay, reference)
    finally:
        replay.close()
        kronk.close()


async def test_agents_arriving_together_prefill_together_exactly(
    tmp_path: Path, recurrent_path: Path
) -> None:
    """Three agents with one system prompt arrive while another request runs: none waits
    for another to prefill the shared prefix (it could not copy it from a state that
    cannot be cut), they prefill in one step, and every token of every answer is that of
    a cold context decoding the same batches."""
    kronk = loaded_kronk(recurrent_path, tmp_path, caching=NO_HOST_TIER, n_seq_max=4)
    engine = loaded(kronk).engine
    replay = BatchReplay(loaded(kronk).config)
    records = step_records(engine)
    try:
        running = conversation(AGENT_SYSTEMS[0], 1)
        agents = [[{"role": "system", "content": SYSTEM}, user_turn(i)] for i in (1, 2, 3)]
        with gated(engine) as gate:
            first = asyncio.ensure_future(ask(kronk, "m", running))
            await gate.wait_held()
            queued = [asyncio.ensure_future(ask(kronk, "m", agent)) for agent in agents]
            await wait_until(lambda: engine.stats().queued == 3)
        results = await asyncio.gather(first, *queued)
        assert max(len(record.prefilling) for record in records) == 3
        assert [r.usage.cached_tokens for r in results] == [0, 0, 0, 0]
        requests: dict[int, Start] = {}
        for messages, result in zip([running, *agents], results, strict=True):
            prompt = await prompt_tokens(kronk, messages)
            requests[slot_of(kronk, prompt)] = Start(prompt, result)
        await replay.check(records, requests)
    finally:
        replay.close()
        kronk.close()


async def test_a_prompt_extending_a_busy_slots_sequence_copies_its_state(
    tmp_path: Path, recurrent_path: Path
) -> None:
    """The one prefix a recurrent state can be copied with: another slot's whole sequence.
    A raw completion extends the sequence of a request still generating in the other
    slot: its state is copied, not prefilled again, and both answers are token for token
    those of a cold context that decodes the same batches and makes the same copy."""
    kronk = loaded_kronk(recurrent_path, tmp_path, caching=NO_HOST_TIER, n_seq_max=2)
    engine = loaded(kronk).engine
    replay = BatchReplay(loaded(kronk).config)
    records = step_records(engine)
    options: dict[str, Any] = {"model": "m", "temperature": 0, "logprobs": True, "top_logprobs": 5}
    try:
        prompt = await prompt_tokens(kronk, conversation(SYSTEM, 1))
        more = await kronk.tokenize("\nNow the figures once more.", model="m")
        with gated(engine, lambda record: bool(record.generating)) as gate:
            running = asyncio.ensure_future(kronk.complete(prompt, max_tokens=24, **options))
            await gate.wait_held()  # it generates in one slot
            (busy,) = [slot for slot in engine.slots if slot.busy]
            held = list(busy.tokens)
            extended = [*held, *more]
            extending = asyncio.ensure_future(kronk.complete(extended, max_tokens=12, **options))
            await wait_until(lambda: engine.stats().queued == 1)
        first, second = await asyncio.gather(running, extending)
        assert second.usage.cached_tokens == len(held) > len(prompt)
        assert engine.cache_counters().shared_prefixes == 1
        (other,) = [slot.id for slot in engine.slots if slot is not busy]
        await replay.check(
            records, {busy.id: Start(prompt, first), other: Start(extended, second, busy.id)}
        )
    finally:
        replay.close()
        kronk.close()


async def test_spc_keeps_nothing_it_cannot_cut_back_to(
    tmp_path: Path, recurrent_path: Path
) -> None:
    """SPC cuts a finished request back to its system prompt to export it; a recurrent
    state cannot be cut there, so SPC keeps nothing and every request runs cold."""
    kronk = loaded_kronk(recurrent_path, tmp_path, cache="spc")
    try:
        results = [await ask(kronk, "m", conversation(SYSTEM, 1)) for _ in range(2)]
        assert [r.usage.cached_tokens for r in results] == [0, 0]
        assert results[0].content == results[1].content
        assert (counters(kronk).hits, counters(kronk).rebuilds) == (0, 2)
    finally:
        kronk.close()
