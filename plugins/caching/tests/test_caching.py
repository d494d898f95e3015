"""Message caching on the real chat models: correctness against cold runs, and the scenarios.

What is about the cache runs on both Gemma 3 270M (a base model with a sliding window) and
SmolLM2-135M-Instruct (the default: instruction-tuned, no window, ChatML from its GGUF);
what is about a sliding window runs on Gemma.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import pickle
import resource
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kronk_caching.host_store import HostStore, StoredConversation
from kronk_core import Kronk, KronkConfig, LoadedModel
from kronk_core.contract.cache import PromptScope
from kronk_core.contract.errors import ContextOverflowError
from kronk_core.contract.sampling import Greedy, resolve_sampling
from kronk_core.contract.tokens import common_prefix
from kronk_core.contract.types import ChatResult
from kronk_core.prompts import PreparedChat, prepare_chat
from kronk_core.runtime.chat_stream import collect
from kronk_llamacpp.packaged import default_model_path, gemma_model_path
from kronk_testing.conversations import (
    AGENT_SYSTEMS,
    MAX_TOKENS,
    SYSTEM,
    ask,
    continued,
    conversation,
    fresh,
    model_config,
    prompt_tokens,
    slot_of,
    user_turn,
)
from kronk_testing.replay import (
    BatchReplay,
    ColdReplay,
    Start,
    assert_same_first_token,
    assert_same_logprobs,
    prompt_of,
    step_records,
)
from kronk_testing.waiting import gated, wait_until

# Real models throughout: the full tier (docs/testing.md).
pytestmark = pytest.mark.model

NO_HOST_TIER = {"host_cache_bytes": 0}


CHAT_MODELS: dict[str, Callable[[], Path]] = {
    "gemma": gemma_model_path,
    "smollm2": default_model_path,
}


@pytest.fixture(scope="module")
def model_path(request: pytest.FixtureRequest) -> Path:
    """The file of the model named by the test's `on_both_models` parameter."""
    return CHAT_MODELS[request.param]()


# A test about the cache, not the model: it runs on each of CHAT_MODELS.
on_both_models = pytest.mark.parametrize("model_path", list(CHAT_MODELS), indirect=True)


@pytest.fixture(scope="module")
def models(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kronk]:
    config = KronkConfig(
        base_path=tmp_path_factory.mktemp("kronk-caching"),
        models={
            "cold": model_config(model_path, cache="none"),
            "imc": model_config(model_path, n_seq_max=2, caching={"host_cache_bytes": 0}),
            "spc": model_config(model_path, cache="spc", n_seq_max=2),
        },
    )
    kronk = Kronk(config)
    yield kronk
    kronk.close()


# How close a one-chunk cold run's two best picks may be where a cached answer parts from
# it. Other decode layouts moved SmolLM2's log-probs by up to 0.42 nats (the cells a copied
# prefix's rest lands in); where its answers parted, the cold run's picks were 0.03 to 0.18
# nats apart (batched with other requests, copied, ten turns).
NEAR_TIE = 0.5

# Enough turns for every kind of reuse (a build, hits, a partial hit after a re-rendered
# answer): four; on Gemma six, for a prompt past its 512-token sliding window. Each turn costs
# two cold prefills of the whole conversation, so more turns add time, not cases.
def turns(model_path: Path) -> int:
    return 6 if model_path == gemma_model_path() else 4


def assert_same_text_or_a_near_tie(
    kronk: Kronk, model: str, result: ChatResult, cold: ChatResult
) -> None:
    """The greedy answer is a one-chunk cold run's, or parts from it only where the cold
    run nearly ties: there it ranks the cached answer's pick (an end of the answer, where
    that ended first) within NEAR_TIE nats of its own. A cache that kept or placed wrong
    tokens parts where the cold run is sure. (The cache's exactness is the replays' to
    prove: this checks that a replay and the cache are not wrong alike.)"""
    loaded = kronk.get_loaded(model)
    assert loaded is not None

    def ends(piece: str) -> bool:
        tokens = loaded.model.tokenize(piece, add_special=False, parse_special=True)
        return len(tokens) == 1 and loaded.model.is_end_of_generation(tokens[0])

    for position in range(max(len(result.logprobs), len(cold.logprobs))):
        ours = result.logprobs[position] if position < len(result.logprobs) else None
        theirs = cold.logprobs[position] if position < len(cold.logprobs) else None
        if ours is not None and theirs is not None and ours.token == theirs.token:
            continue
        # Where they part, by the log-probs of the run that went on (the cold one if both).
        went_on = theirs or ours
        assert went_on is not None
        picks = {t.token: t.logprob for t in went_on.top_logprobs}
        other = ours if went_on is theirs else theirs
        if other is not None:
            rival = picks.get(other.token)
        else:  # the other answer ended here
            rival = max((lp for token, lp in picks.items() if ends(token)), default=None)
        assert rival is not None and went_on.logprob - rival < NEAR_TIE, (
            position,
            result.content,
            cold.content,
            picks,
        )
        return


@on_both_models
@pytest.mark.parametrize("strategy", ["imc", "spc"])
async def test_turns_match_a_cold_run(models: Kronk, model_path: Path, strategy: str) -> None:
    messages = [{"role": "system", "content": SYSTEM}]
    previous_prompt = 0
    replay = ColdReplay(models.load(strategy).config)
    try:
        for turn in range(turns(model_path)):
            messages.append(user_turn(turn))
            cached = await ask(models, strategy, messages)
            cold = await ask(models, "cold", messages)
            prompt = prompt_of(models, strategy, messages)
            assert cached.usage.prompt_tokens == len(prompt)
            if strategy == "spc" and turn > 0:
                # The restored state is turn 0's one-chunk prefill, trimmed to the system prompt.
                replay.prefill(prompt_of(models, strategy, messages[:2]), 0)
            reference = replay.prefill(prompt, cached.usage.cached_tokens)
            assert_same_first_token(cached, reference)
            assert replay.generate(MAX_TOKENS) == cached.content
            assert_same_logprobs(cached, replay)
            assert_same_text_or_a_near_tie(models, strategy, cached, cold)
            assert cold.usage.cached_tokens == 0
            if turn == 0:
                assert cached.usage.cached_tokens == 0
            elif strategy == "imc":
                # Everything up to the previous prompt is reused: the turn only appended.
                assert cached.usage.cached_tokens >= previous_prompt
            else:
                assert 100 < cached.usage.cached_tokens < previous_prompt
            previous_prompt = cached.usage.prompt_tokens
            messages.append({"role": "assistant", "content": cached.content})
    finally:
        replay.close()
    counters = models.load(strategy).engine.cache_counters()
    # A partial hit cut only the last answer, re-rendered by the client into other tokens
    # (everything up to the previous prompt was kept, as checked each turn).
    assert counters.hits + counters.partial_hits >= turns(model_path) - 1
    assert counters.rebuilds >= 1


def disk_tier(directory: Path) -> dict[str, Any]:
    """One slot (each new conversation evicts the last), a host tier in RAM and on disk."""
    return {"caching": {"host_cache_dir": directory, "host_cache_bytes": 1 << 30}, "n_seq_max": 1}


@on_both_models
async def test_build_extend_hit_edit_and_rebuild(model_path: Path, tmp_path: Path) -> None:
    kronk = fresh(model_path, tmp_path, caching=NO_HOST_TIER)
    try:
        first = await ask(kronk, "m", conversation(SYSTEM, 1))
        assert first.usage.cached_tokens == 0
        extended = await ask(kronk, "m", conversation(SYSTEM, 2))
        assert extended.usage.cached_tokens >= first.usage.prompt_tokens
        repeat = await ask(kronk, "m", conversation(SYSTEM, 2))
        # Greedy, so reproducible: the repeat decodes its prompt's last chunk again, from
        # where the extension began it (docs/speculative.md, "Reproducible answers").
        assert repeat.usage.cached_tokens == extended.usage.cached_tokens
        edited = conversation(SYSTEM, 2)
        edited[1] = {"role": "user", "content": "Turn 0: something else entirely."}
        partial = await ask(kronk, "m", edited)
        assert 100 < partial.usage.cached_tokens < repeat.usage.cached_tokens
        short_system = conversation("Be brief.", 2)
        rebuilt = await ask(kronk, "m", short_system)
        assert rebuilt.usage.cached_tokens == 0
        counters = kronk.get_loaded("m").engine.cache_counters()  # type: ignore[union-attr]
        # The extension also trims: the client sent a different answer than was generated.
        # The edit leaves the conversation in its slot and copies the prefix to the other one.
        assert (counters.hits, counters.partial_hits, counters.rebuilds) == (1, 1, 2)
        assert counters.shared_prefixes == 1
    finally:
        kronk.close()


def slot_holding(kronk: Kronk, prefix_of: list[int]) -> list[int]:
    engine = kronk.get_loaded("m").engine  # type: ignore[union-attr]
    return [slot.id for slot in engine.slots if slot.tokens[:50] == prefix_of[:50]]


async def test_sub_agents_keep_their_slots(gemma_path: str, tmp_path: Path) -> None:
    kronk = fresh(gemma_path, tmp_path, caching=NO_HOST_TIER)
    try:
        a, b = (conversation(system, 1) for system in AGENT_SYSTEMS[:2])
        await ask(kronk, "m", a)
        await ask(kronk, "m", b)
        slot_a = slot_holding(kronk, await prompt_tokens(kronk, a))
        slot_b = slot_holding(kronk, await prompt_tokens(kronk, b))
        assert len(slot_a) == 1 and len(slot_b) == 1 and slot_a != slot_b
        for turn in range(2, 4):
            a, b = (conversation(system, turn) for system in AGENT_SYSTEMS[:2])
            assert (await ask(kronk, "m", a)).usage.cached_tokens > 100
            assert (await ask(kronk, "m", b)).usage.cached_tokens > 100
            assert slot_holding(kronk, await prompt_tokens(kronk, a)) == slot_a
            assert slot_holding(kronk, await prompt_tokens(kronk, b)) == slot_b
    finally:
        kronk.close()


@pytest.mark.parametrize("host_bytes", [0, 1 << 30])
async def test_third_agent_evicts_lru_and_host_tier_restores(
    gemma_path: str, tmp_path: Path, host_bytes: int
) -> None:
    kronk = fresh(gemma_path, tmp_path, caching={"host_cache_bytes": host_bytes})
    try:
        a, b, c = (conversation(system, 1) for system in AGENT_SYSTEMS)
        await ask(kronk, "m", a)
        await ask(kronk, "m", b)
        await ask(kronk, "m", c)  # evicts a, the least recently used
        again = await ask(kronk, "m", conversation(AGENT_SYSTEMS[0], 2))
        counters = kronk.get_loaded("m").engine.cache_counters()  # type: ignore[union-attr]
        assert counters.evictions >= 1
        if host_bytes:
            assert counters.restores == 1
            assert again.usage.cached_tokens > 100
        else:
            assert counters.restores == 0
            assert again.usage.cached_tokens == 0
    finally:
        kronk.close()


async def test_simultaneous_new_conversations_get_different_slots(
    gemma_path: str, tmp_path: Path
) -> None:
    kronk = fresh(gemma_path, tmp_path, caching=NO_HOST_TIER)
    try:
        a, b = (conversation(system, 1) for system in AGENT_SYSTEMS[:2])
        await asyncio.gather(ask(kronk, "m", a), ask(kronk, "m", b))
        slot_a = slot_holding(kronk, await prompt_tokens(kronk, a))
        slot_b = slot_holding(kronk, await prompt_tokens(kronk, b))
        assert len(slot_a) == 1 and len(slot_b) == 1 and slot_a != slot_b
    finally:
        kronk.close()


@on_both_models
async def test_rerendered_assistant_turn_differs_from_generated_tokens(models: Kronk) -> None:
    """The "tart" case: what the client sends back is not what the model generated."""
    # A system prompt of its own: sharing the other tests' prefix would copy it from their
    # slot, whose cells lie elsewhere than a cold run's (rounding differs).
    messages = [{"role": "system", "content": AGENT_SYSTEMS[2]}, user_turn(0)]
    first = await ask(models, "imc", messages)
    # A client that strips or reformats the answer: its tokens now differ from the KV.
    messages.append({"role": "assistant", "content": "  " + first.content.upper() + "\n\n"})
    messages.append(user_turn(1))
    cached = await ask(models, "imc", messages)
    cold = await ask(models, "cold", messages)
    assert_same_text_or_a_near_tie(models, "imc", cached, cold)
    assert 100 < cached.usage.cached_tokens < cached.usage.prompt_tokens
    # The slot was cut where the re-rendered answer left the generated tokens.
    assert cached.usage.cached_tokens < first.usage.prompt_tokens + first.usage.completion_tokens


@on_both_models
async def test_a_cut_conversation_matches_a_cold_replay(model_path: Path, tmp_path: Path) -> None:
    """The slot is cut where the re-rendered answer leaves the generated tokens; a replay of
    the slot's decodes (the first turn, its answer token by token), cut at the same place,
    gives the same log-probs at every position."""
    kronk = fresh(model_path, tmp_path, caching=NO_HOST_TIER, n_seq_max=1)
    replay = ColdReplay(model_config(model_path))
    try:
        messages = [{"role": "system", "content": AGENT_SYSTEMS[2]}, user_turn(0)]
        first = await ask(kronk, "m", messages)
        replay.prefill(await prompt_tokens(kronk, messages), 0)
        assert replay.generate(MAX_TOKENS) == first.content
        assert_same_logprobs(first, replay)
        messages.append({"role": "assistant", "content": "  " + first.content.upper() + "\n\n"})
        messages.append(user_turn(1))
        cut = await ask(kronk, "m", messages)
        assert kronk.get_loaded("m").engine.cache_counters().partial_hits == 1  # type: ignore[union-attr]
        assert (
            100
            < cut.usage.cached_tokens
            < first.usage.prompt_tokens + first.usage.completion_tokens
        )
        reference = replay.prefill(await prompt_tokens(kronk, messages), cut.usage.cached_tokens)
        assert_same_first_token(cut, reference)
        assert replay.generate(MAX_TOKENS) == cut.content
        assert_same_logprobs(cut, replay)
    finally:
        replay.close()
        kronk.close()


@on_both_models
async def test_host_tier_on_disk_survives_restart_and_checks_config(
    model_path: Path, tmp_path: Path
) -> None:
    disk = tmp_path / "kv"
    settings = {"caching": {"host_cache_dir": disk, "host_cache_bytes": 1 << 30}, "n_seq_max": 1}
    kronk = fresh(model_path, tmp_path, **settings)
    try:
        await ask(kronk, "m", conversation(AGENT_SYSTEMS[0], 1))
        await ask(kronk, "m", conversation(AGENT_SYSTEMS[1], 1))  # evicts agent 0 to disk
    finally:
        kronk.close()
    restarted = fresh(model_path, tmp_path, **settings)
    try:
        back = await ask(restarted, "m", conversation(AGENT_SYSTEMS[0], 2))
        assert back.usage.cached_tokens > 100
    finally:
        restarted.close()
    other_layout = fresh(model_path, tmp_path, **settings, context_window=2048)
    try:
        back = await ask(other_layout, "m", conversation(AGENT_SYSTEMS[0], 2))
        assert back.usage.cached_tokens == 0
    finally:
        other_layout.close()


async def test_context_overflow_trim_drops_oldest_messages(gemma_path: str, tmp_path: Path) -> None:
    kronk = fresh(gemma_path, tmp_path, context_window=512, context_overflow="trim")
    try:
        long = conversation("Be brief.", 12)
        stream = await kronk.start_chat(
            kronk.chat_request(long, model="m", max_tokens=32, temperature=0)
        )
        prompt = stream.prompt_text
        result = await collect(stream)
        assert result.usage.dropped_tokens > 0
        assert result.usage.prompt_tokens + 32 <= 512
        # The system message stays, and so does the question; the turns that went are the
        # oldest ones, and no more of them than had to go.
        assert prompt.index("Be brief.") < prompt.index(long[-1]["content"])
        present = [message["content"] in prompt for message in long[1:]]
        dropped = present.index(True)
        assert dropped > 0 and all(present[dropped:])
        loaded = kronk.get_loaded("m")
        assert loaded is not None

        def prepared(messages: list[dict[str, str]]) -> PreparedChat:
            request = kronk.chat_request(messages, model="m", max_tokens=32)
            return prepare_chat(loaded, request, PromptScope())

        kept = prepared([long[0], *long[1 + dropped :]])
        assert (kept.prompt_text, kept.dropped_tokens) == (prompt, 0)
        assert len(kept.generation.prompt_tokens) == result.usage.prompt_tokens
        assert prepared([long[0], *long[dropped:]]).dropped_tokens > 0  # one more: no room
    finally:
        kronk.close()


async def test_context_overflow_trim_keeps_the_turn_a_continued_message_answers(
    gemma_path: str, tmp_path: Path
) -> None:
    kronk = fresh(gemma_path, tmp_path, context_window=512, context_overflow="trim")
    prefill = {"role": "assistant", "content": "Answer 11:"}
    try:
        long = [*conversation("Be brief.", 12), prefill]
        result = await kronk.chat(
            long, model="m", max_tokens=32, temperature=0, continue_final_message=True
        )
        assert result.usage.dropped_tokens > 0
        request = kronk.chat_request(long, model="m", max_tokens=32, continue_final_message=True)
        loaded = kronk.get_loaded("m")
        assert loaded is not None
        prepared = prepare_chat(loaded, request, PromptScope())
        tail = loaded.tokenize_prompt(
            f"<start_of_turn>user\n{user_turn(11)['content']}<end_of_turn>\n"
            "<start_of_turn>model\nAnswer 11:"
        )
        assert list(prepared.generation.prompt_tokens[-len(tail) :]) == tail
        # A question that alone does not fit is not dropped from under its answer.
        huge = {"role": "user", "content": "word " * 600}
        with pytest.raises(ContextOverflowError):
            await kronk.chat(
                [{"role": "system", "content": "Be brief."}, huge, prefill],
                model="m", max_tokens=32, continue_final_message=True,
            )  # fmt: skip
    finally:
        kronk.close()


@on_both_models
async def test_spc_reuses_the_only_system_prompt_for_requests_without_one(models: Kronk) -> None:
    # The first request leaves SYSTEM as the only system prompt known to "spc".
    with_system = await ask(models, "spc", [{"role": "system", "content": SYSTEM}, user_turn(3)])
    without = await ask(models, "spc", [user_turn(3)])
    assert without.usage.cached_tokens > 100
    assert without.usage.prompt_tokens == with_system.usage.prompt_tokens
    assert without.content == with_system.content
    # Counting (Anthropic's count_tokens, tokenize with a template) sees the same prompt,
    # and counting a new system prompt does not make it known.
    request = models.chat_request([user_turn(3)], model="spc")
    count = await models.count_prompt_tokens(request, add_generation_prompt=True)
    assert count == without.usage.prompt_tokens
    other_system = [{"role": "system", "content": "Other."}, user_turn(3)]
    other = models.chat_request(other_system, model="spc")
    await models.count_prompt_tokens(other, add_generation_prompt=True)
    assert await models.count_prompt_tokens(request, add_generation_prompt=True) == count


def long_user_turn(index: int) -> dict[str, str]:
    """About 200 tokens: a tool result, so that few turns outgrow the sliding window."""
    rows = "\n".join(
        f"sensor {index}.{row}: reading {row * 37 % 101} units, ok" for row in range(16)
    )
    return {"role": "user", "content": f"Turn {index}: here are the readings.\n{rows}\nSummarise."}


async def long_conversation(
    kronk: Kronk, turns: int
) -> tuple[list[dict[str, str]], list[tuple[list[int], ChatResult]]]:
    """`turns` long tool-result turns on model "m": the messages, and each turn's prompt
    tokens and answer."""
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    history = []
    for turn in range(turns):
        messages.append(long_user_turn(turn))
        result = await ask(kronk, "m", messages)
        history.append((await prompt_tokens(kronk, messages), result))
        messages.append({"role": "assistant", "content": result.content})
    return messages, history


def replay_turns(
    replay: ColdReplay, history: list[tuple[list[int], ChatResult]], up_to: int
) -> None:
    """Decode the chunks the slot decoded for these turns; answers before `up_to` too."""
    for turn_prompt, turn_result in history:
        replay.prefill(turn_prompt, turn_result.usage.cached_tokens)
        if len(turn_prompt) < up_to:
            assert replay.generate(MAX_TOKENS) == turn_result.content


def replay_cut_through_checkpoint(
    replay: ColdReplay,
    history: list[tuple[list[int], ChatResult]],
    keep: int,
    restored: bool = False,
) -> None:
    """The slot's decode up to the end of the last prompt of `history`, where it took a
    checkpoint; that checkpoint restored (into other cells, as a restore places it) and
    the sequence cut back to `keep` tokens through it. `restored`: the whole sequence was
    restored from the host tier first (its cells moved too)."""
    replay_turns(replay, history, up_to=len(history[-1][0]))
    checkpoint = replay.model.checkpoint(0)
    if restored:
        replay.move_cells()
    assert replay.model.restore_checkpoint(0, keep, checkpoint)
    del replay.tokens[keep:]


async def test_sliding_window_cut_back_through_a_checkpoint(
    gemma_path: str, tmp_path: Path
) -> None:
    """Sliding-window KV (swa_full false) has lost positions a cut needs: a checkpoint has them.

    One slot keeps 1,024 window cells, so after ~1,800 tokens editing a message
    600 tokens back is below the trim floor and goes through the checkpoint
    taken at the end of the prompt that first held the edited message: its
    window cells reach back past where the edit begins, so all the prompt shares
    is kept. The reference decodes the same chunks as the slot did up to that
    checkpoint, cuts back through it, then decodes the edited rest. (Where window
    cells lie changes rounding, so a full-size window cache is no reference here.)
    """
    kronk = fresh(gemma_path, tmp_path, caching=NO_HOST_TIER, n_seq_max=1)
    cold = fresh(gemma_path, tmp_path, cache="none", n_seq_max=1)
    loaded = kronk.load("m")
    assert not loaded.model.info.kv_trimmable and loaded.model.info.n_swa == 512
    replay = ColdReplay(model_config(Path(gemma_path)))
    try:
        messages, history = await long_conversation(kronk, 7)
        floor = loaded.model.trim_floor(0)
        edited = [*messages[:-4], long_user_turn(99)]  # replaces turn 5's tool result
        prompt = await prompt_tokens(kronk, edited)
        shared = common_prefix(prompt, loaded.engine.slots[0].tokens)
        assert len(history[4][0]) < shared < floor
        result = await ask(kronk, "m", edited)
        assert loaded.engine.cache_counters().checkpoint_restores == 1
        # Through the checkpoint at the end of turn 5's prompt, past turn 4's answer.
        assert result.usage.cached_tokens == shared
        # A restored window lies in other cells than it was computed in, which changes
        # rounding by up to 0.4 nats here: move the reference's own window the same way.
        replay_cut_through_checkpoint(replay, history[:6], shared)
        reference = replay.prefill(prompt, result.usage.cached_tokens)
        assert_same_first_token(result, reference)
        assert replay.generate(MAX_TOKENS) == result.content
        assert result.content == (await ask(cold, "m", edited)).content
    finally:
        replay.close()
        kronk.close()
        cold.close()


async def test_a_branch_restores_its_own_turn_not_a_longer_branch_it_cannot_cut(
    gemma_path: str, tmp_path: Path
) -> None:
    """Conversation A runs 12 turns on a sliding-window model, then other traffic takes its
    slot. B starts as A did (a reopened chat, a retried task: the same messages) and runs
    4 turns, other traffic taking the slot between them. The host tier holds A (the
    longest match, but its window moved on: it cannot be cut back to where B's prompt
    leaves it but through the checkpoint of A's first prompt, which A keeps besides its
    latest ones) and B's own last turn. B's first turn restores A through that checkpoint
    (all but its last prompt token, which it decodes again to sample from: the checkpoint
    reaches back to its trim floor); each later turn restores B's own, so it prefills
    only what its turn added. Every answer is token for token a cold replay's."""
    kronk = fresh(gemma_path, tmp_path, n_seq_max=1, caching={"host_cache_bytes": 1 << 30})
    replay = ColdReplay(model_config(Path(gemma_path)))
    other = iter([*AGENT_SYSTEMS, "You are sub-agent Delta. " + SYSTEM])
    try:
        a: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
        for turn in range(12):
            a.append(long_user_turn(turn))
            a.append({"role": "assistant", "content": (await ask(kronk, "m", a)).content})
        await ask(kronk, "m", conversation(next(other), 1))  # A leaves its slot
        b: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
        previous = 0
        for turn in range(4):
            b.append(long_user_turn(turn))
            prompt = await prompt_tokens(kronk, b)
            a_entry = host_store(kronk).best(prompt, lambda entry, shared: shared)[1]
            assert a_entry is not None and len(a_entry.tokens) > len(prompt)  # A matches most
            result = await ask(kronk, "m", b)
            if turn:
                assert result.usage.cached_tokens >= previous
                replay.move_cells()  # restored: its cells lie elsewhere, as in the slot
            else:
                assert result.usage.cached_tokens == len(prompt) - 1
                # A's first prompt, decoded in one chunk as A's was; its checkpoint then
                # restored into moved cells and cut back by one token, as the slot was.
                replay.prefill(prompt, 0)
                checkpoint = replay.model.checkpoint(0)
                replay.move_cells()
                assert replay.model.restore_checkpoint(0, len(prompt) - 1, checkpoint)
                replay.tokens = prompt[:-1]
            reference = replay.prefill(prompt, result.usage.cached_tokens)
            assert_same_first_token(result, reference)
            assert replay.generate(MAX_TOKENS) == result.content
            assert_same_logprobs(result, replay)
            previous = len(prompt)
            b.append({"role": "assistant", "content": result.content})
            if turn < 3:
                await ask(kronk, "m", conversation(next(other), 1))
        counters = kronk.load("m").engine.cache_counters()
        assert counters.restores == 4 and counters.checkpoint_restores == 1
    finally:
        replay.close()
        kronk.close()


async def test_a_stored_conversation_is_cut_back_through_its_stored_checkpoint(
    gemma_path: str, tmp_path: Path
) -> None:
    """A sliding-window conversation evicted to disk keeps its checkpoints and how far back
    each reaches: after a restart, an edit of a message 600 tokens back (below its trim
    floor) restores it through the checkpoint taken at the end of the prompt that first
    held that message, exactly as its slot would have."""
    caching = {"host_cache_bytes": 0, "host_cache_dir": tmp_path / "kv"}
    kronk = fresh(gemma_path, tmp_path, caching=caching, n_seq_max=1)
    replay = ColdReplay(model_config(Path(gemma_path)))
    try:
        messages, history = await long_conversation(kronk, 7)
        floor = kronk.load("m").model.trim_floor(0)
        await ask(kronk, "m", conversation(AGENT_SYSTEMS[0], 1))  # evicts it to disk
    finally:
        kronk.close()
    restarted = fresh(gemma_path, tmp_path, caching=caching, n_seq_max=1)
    try:
        edited = [*messages[:-4], long_user_turn(99)]  # replaces turn 5's tool result
        prompt = await prompt_tokens(restarted, edited)
        shared = common_prefix(prompt, history[-1][0])
        assert len(history[4][0]) < shared < floor
        result = await ask(restarted, "m", edited)
        counters = restarted.load("m").engine.cache_counters()
        assert counters.restores == 1 and counters.checkpoint_restores == 1
        assert result.usage.cached_tokens == shared
        # Restored, then cut through the checkpoint: move the reference's cells the same way.
        replay_cut_through_checkpoint(replay, history[:6], shared, restored=True)
        reference = replay.prefill(prompt, result.usage.cached_tokens)
        assert_same_first_token(result, reference)
        assert replay.generate(MAX_TOKENS) == result.content
        assert_same_logprobs(result, replay)
    finally:
        replay.close()
        restarted.close()


@on_both_models
@pytest.mark.parametrize("repeats", [1, 5], ids=["short-prefix", "long-prefix"])
async def test_new_conversation_copies_a_shared_prefix_from_another_slot(
    model_path: Path, tmp_path: Path, repeats: int
) -> None:
    """Two agents of one tool: the second one's system prompt comes from the first one's slot.

    On Gemma a prefix of ~1,500 tokens outgrows the two slots' window cache (1,536
    cells): the copy must bring the window cells the next token attends to. Both answers
    are a cache-less replay's of the engine's batches, the second one's after a copy of
    the first one's prefix (where the copy's cells lie changes rounding).
    """
    kronk = fresh(model_path, tmp_path, caching=NO_HOST_TIER)
    loaded = kronk.load("m")
    assert isinstance(loaded, LoadedModel)
    replay = BatchReplay(loaded.config)
    try:
        first = [{"role": "system", "content": SYSTEM * repeats}, user_turn(0)]
        second = [{"role": "system", "content": SYSTEM * repeats}, user_turn(5)]
        records = step_records(loaded.engine)
        answer = await ask(kronk, "m", first)
        copied = await ask(kronk, "m", second)
        engine = loaded.engine
        assert sum(1 for slot in engine.slots if slot.tokens) == 2  # the first agent kept its slot
        assert engine.cache_counters().shared_prefixes == 1
        first_prompt = await prompt_tokens(kronk, first)
        second_prompt = await prompt_tokens(kronk, second)
        shared = common_prefix(first_prompt, second_prompt)
        assert copied.usage.cached_tokens == shared > 100
        donor = slot_of(kronk, first_prompt)
        await replay.check(
            records,
            {
                donor: Start(first_prompt, answer),
                slot_of(kronk, second_prompt): Start(second_prompt, copied, donor),
            },
        )
    finally:
        replay.close()
        kronk.close()


@on_both_models
async def test_split_kv_streams_copy_a_shared_prefix_exactly(
    model_path: Path, tmp_path: Path
) -> None:
    """`kv_unified: false`: one KV stream per slot; a shared prefix is copied as a whole
    stream, then cut back, and the copy sits in the same cells as in a cold context."""
    kronk = fresh(model_path, tmp_path, caching=NO_HOST_TIER, llamacpp={"kv_unified": False})
    replay = ColdReplay(model_config(model_path))
    try:
        first = [{"role": "system", "content": SYSTEM}, user_turn(0)]
        second = [{"role": "system", "content": SYSTEM}, user_turn(5)]
        await ask(kronk, "m", first)
        copied = await ask(kronk, "m", second)
        engine = kronk.get_loaded("m").engine  # type: ignore[union-attr]
        assert engine.cache_counters().shared_prefixes == 1
        assert sum(1 for slot in engine.slots if slot.tokens) == 2
        first_prompt = await prompt_tokens(kronk, first)
        second_prompt = await prompt_tokens(kronk, second)
        shared = common_prefix(first_prompt, second_prompt)
        assert copied.usage.cached_tokens == shared > 100
        replay.prefill(first_prompt, 0)
        reference = replay.prefill(second_prompt, shared)
        assert_same_first_token(copied, reference)
        assert replay.generate(MAX_TOKENS) == copied.content
        assert_same_logprobs(copied, replay)
        # The donor's own conversation is intact: it continues from its slot.
        again = await ask(
            kronk, "m", [*first, {"role": "assistant", "content": "ok"}, user_turn(1)]
        )
        assert again.usage.cached_tokens >= len(first_prompt) - 2
    finally:
        replay.close()
        kronk.close()


async def test_agents_sharing_a_long_prefix_keep_the_window_cache_usable(
    gemma_path: str, tmp_path: Path
) -> None:
    """Four agents, one ~1,500-token system prompt, turns at once: copies never fill the window.

    llama.cpp recycles a window cell only while a single sequence holds it; copies
    that shared window cells left no room for the next batch (decode failed).
    """
    kronk = fresh(gemma_path, tmp_path, caching=NO_HOST_TIER, n_seq_max=4)
    try:
        conversations = [[{"role": "system", "content": SYSTEM * 5}] for _ in range(4)]
        for turn in range(3):
            for index, messages in enumerate(conversations):
                messages.append(user_turn(turn * 4 + index))
            results = await asyncio.gather(*(ask(kronk, "m", m) for m in conversations))
            for messages, result in zip(conversations, results, strict=True):
                assert result.usage.completion_tokens > 0
                messages.append({"role": "assistant", "content": result.content})
        counters = kronk.get_loaded("m").engine.cache_counters()  # type: ignore[union-attr]
        assert counters.shared_prefixes == 3 and counters.hits >= 8
    finally:
        kronk.close()


@on_both_models
async def test_simultaneous_agents_prefill_their_shared_prefix_once(
    model_path: Path, tmp_path: Path
) -> None:
    """Requests that arrive together wait for the one prefilling their common prefix, then
    copy it: each answer is a cache-less replay's of the engine's batches and copies.

    On SmolLM2 the second agent's first token is a near tie ("The" and "I", 0.18 nats
    apart in a one-chunk cold run, 0.005 batched): in 5 of 12 runs it answered "I'm
    glad you're here, ..." instead of the forecast, exactly as its replay does.
    """
    kronk = fresh(model_path, tmp_path, caching=NO_HOST_TIER, n_seq_max=3)
    cold = fresh(model_path, tmp_path, cache="none", n_seq_max=1)
    loaded = kronk.load("m")
    assert isinstance(loaded, LoadedModel)
    replay = BatchReplay(loaded.config)
    try:
        agents = [[{"role": "system", "content": SYSTEM}, user_turn(i)] for i in range(3)]
        records = step_records(loaded.engine)
        results = await asyncio.gather(*(ask(kronk, "m", agent) for agent in agents))
        assert loaded.engine.cache_counters().shared_prefixes == 2
        assert sorted(r.usage.cached_tokens > 100 for r in results) == [False, True, True]
        prompts = [await prompt_tokens(kronk, agent) for agent in agents]
        slots = [slot_of(kronk, prompt) for prompt in prompts]
        (donor,) = [s for s, r in zip(slots, results, strict=True) if not r.usage.cached_tokens]
        await replay.check(
            records,
            {
                slot: Start(prompt, result, None if slot == donor else donor)
                for slot, prompt, result in zip(slots, prompts, results, strict=True)
            },
        )
        for agent, result in zip(agents, results, strict=True):
            assert_same_text_or_a_near_tie(cold, "m", result, await ask(cold, "m", agent))
    finally:
        replay.close()
        kronk.close()
        cold.close()


@on_both_models
@pytest.mark.parametrize("tier", ["ram", "disk", "disk-after-restart"])
async def test_a_conversation_restored_from_the_host_tier_matches_a_cold_replay(
    model_path: Path, tmp_path: Path, tier: str
) -> None:
    """Evicted by two other conversations, then continued: restored from RAM, from disk (no
    RAM copy kept), or from disk by a server started anew, cut where the client's
    re-rendered answer differs, and exact."""
    caching: dict[str, Any] = {"host_cache_bytes": 1 << 30}
    if tier != "ram":
        caching = {"host_cache_bytes": 0, "host_cache_dir": tmp_path / "kv"}
    kronk = fresh(model_path, tmp_path, caching=caching, n_seq_max=1)
    replay = ColdReplay(model_config(model_path))
    try:
        first_turn = conversation(AGENT_SYSTEMS[0], 1)
        first = await ask(kronk, "m", first_turn)
        replay.prefill(await prompt_tokens(kronk, first_turn), 0)
        assert replay.generate(MAX_TOKENS) == first.content
        for system in AGENT_SYSTEMS[1:]:  # each evicts the one before
            await ask(kronk, "m", conversation(system, 1))
        store = host_store(kronk)
        assert len(store) == 2  # the first two conversations; the third is in the slot
        assert (store.ram_bytes == 0) == (tier != "ram")
        if tier != "ram":
            assert len(list((tmp_path / "kv").glob("*/*.state"))) == 2
        if tier == "disk-after-restart":
            kronk.close()
            kronk = fresh(model_path, tmp_path, caching=caching, n_seq_max=1)
            assert len(host_store(kronk)) == 2
        second_turn = continued(first_turn, first)
        restored = await ask(kronk, "m", second_turn)
        counters = kronk.get_loaded("m").engine.cache_counters()  # type: ignore[union-attr]
        assert counters.restores == 1
        assert counters.evictions == (0 if tier == "disk-after-restart" else 3)
        await assert_restored_exactly(kronk, replay, second_turn, restored)
    finally:
        replay.close()
        kronk.close()


async def assert_restored_exactly(
    kronk: Kronk, replay: ColdReplay, messages: list[dict[str, str]], restored: ChatResult
) -> None:
    """`restored` continued a conversation from the host tier, cut where the client's
    re-rendered answer left it: every token is the replay's (which holds the conversation
    as it was stored) decoded the same way."""
    assert 100 < restored.usage.cached_tokens < restored.usage.prompt_tokens
    # A restored state's cells lie elsewhere than where they were computed: move the
    # replay's the same way, then cut and prefill as the slot did.
    replay.move_cells()
    prompt = await prompt_tokens(kronk, messages)
    reference = replay.prefill(prompt, restored.usage.cached_tokens)
    assert_same_first_token(restored, reference)
    assert replay.generate(MAX_TOKENS) == restored.content
    assert_same_logprobs(restored, replay)


# Kills itself (SIGKILL) midway through writing its host tier: see its docstring.
HOST_TIER_WRITER = Path(__file__).with_name("host_tier_writer.py")


@on_both_models
@pytest.mark.parametrize(
    ("scenario", "stage"),
    [
        ("evict", "state-half-written"),
        ("evict", "index-unwritten"),
        ("write-through", "state-half-written"),
    ],
)
async def test_a_server_killed_while_writing_its_disk_tier_restores_what_it_wrote_whole(
    model_path: Path, tmp_path: Path, scenario: str, stage: str
) -> None:
    """`kill -9` in the middle of writing a conversation to the disk tier (half its state
    written, or its state in place but not the tokens file that makes it an entry): a
    server started anew loads only the entries written whole, and a conversation restored
    from one is exact. Written through (`host_cache_shared`), a conversation already on
    disk is written again when evicted: its entry stays whole until the new one is."""
    disk = tmp_path / "kv"
    caching: dict[str, Any] = {"host_cache_bytes": 0, "host_cache_dir": disk}
    if scenario == "write-through":
        caching["host_cache_shared"] = True
    answers = tmp_path / "answers.pickle"
    spec = {"model": model_path, "home": tmp_path, "caching": caching, "answers": answers}
    spec |= {"scenario": scenario, "stage": stage}
    writer = subprocess.run(
        [sys.executable, HOST_TIER_WRITER, json.dumps(spec, default=str)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert writer.returncode == -signal.SIGKILL, writer.stderr
    first: ChatResult = pickle.loads(answers.read_bytes())[0]
    # Where it died: a partial state file, or a state file no tokens file indexes.
    states = {path.stem for path in disk.rglob("*.state")}
    indexed = {path.stem for path in disk.rglob("*.tokens")}
    if stage == "state-half-written":
        assert len(list(disk.rglob("*.state.*.partial"))) == 1 and states == indexed
    else:
        assert len(states - indexed) == 1
    kronk = fresh(model_path, tmp_path, caching=caching, n_seq_max=1)
    replay = ColdReplay(model_config(model_path))
    try:
        first_turn = conversation(AGENT_SYSTEMS[0], 1)
        assert len(host_store(kronk)) == 1  # the first conversation's first turn, whole
        replay.prefill(await prompt_tokens(kronk, first_turn), 0)
        assert replay.generate(MAX_TOKENS) == first.content
        second_turn = continued(first_turn, first)
        restored = await ask(kronk, "m", second_turn)
        assert kronk.get_loaded("m").engine.cache_counters().restores == 1  # type: ignore[union-attr]
        await assert_restored_exactly(kronk, replay, second_turn, restored)
    finally:
        replay.close()
        kronk.close()


@on_both_models
async def test_conversations_running_at_once_match_cold_replays(
    model_path: Path, tmp_path: Path
) -> None:
    """Three conversations whose turns run at once, each extended in its own slot: every
    token of every turn is a cold replay's that decodes the same batches."""
    kronk = fresh(model_path, tmp_path, caching=NO_HOST_TIER, n_seq_max=3)
    loaded = kronk.load("m")
    assert isinstance(loaded, LoadedModel)
    replay = BatchReplay(loaded.config)
    engine = loaded.engine
    records = step_records(engine)
    try:
        conversations = [[{"role": "system", "content": system}] for system in AGENT_SYSTEMS]
        for turn in range(3):
            for index, messages in enumerate(conversations):
                messages.append(user_turn(turn * 3 + index))
            records.clear()  # the last turn's were all in when it was checked
            # The first turn is held after its first step until the other two are queued:
            # however slow the machine, all three then share steps.
            before = engine.stats().steps
            with gated(engine, lambda record, before=before: record.index > before) as gate:
                first = asyncio.ensure_future(ask(kronk, "m", conversations[0]))
                await gate.wait_held()
                rest = [asyncio.ensure_future(ask(kronk, "m", m)) for m in conversations[1:]]
                await wait_until(lambda: engine.stats().queued == 2, timeout=60)
            results = await asyncio.gather(first, *rest)
            assert any(len(r.generating) + len(r.prefilling) == 3 for r in records)
            prompts = [await prompt_tokens(kronk, messages) for messages in conversations]
            slots = [slot_of(kronk, prompt) for prompt in prompts]
            for result in results:
                assert result.usage.cached_tokens > (100 if turn else -1)
            await replay.check(
                records,
                {
                    slot: Start(prompt, result)
                    for slot, prompt, result in zip(slots, prompts, results, strict=True)
                },
            )
            for messages, result in zip(conversations, results, strict=True):
                messages.append({"role": "assistant", "content": result.content})
        counters = loaded.engine.cache_counters()
        assert counters.hits + counters.partial_hits == 6 and counters.evictions == 0
    finally:
        replay.close()
        kronk.close()


@on_both_models
async def test_seeded_sampling_on_a_cached_conversation_matches_a_cold_replay(
    model_path: Path, tmp_path: Path
) -> None:
    """Not greedy: temperature 0.9 with a seed. The cached turns sample the same tokens as
    a cold replay running the same seeded sampler chain."""
    kronk = fresh(model_path, tmp_path, caching=NO_HOST_TIER, n_seq_max=1)
    replay = ColdReplay(model_config(model_path))
    sampling: dict[str, Any] = {"temperature": 0.9, "top_k": 40, "seed": 4242, "max_tokens": 24}
    try:
        loaded = kronk.load("m")
        assert isinstance(loaded, LoadedModel)
        request = kronk.chat_request(conversation(SYSTEM, 1), model="m", **sampling)
        params = resolve_sampling(request.sampling, loaded.config.sampling)
        stages = kronk.hook.kronk_sampler_stages(params=params, model_info=loaded.info)
        assert not isinstance(stages[-1], Greedy)
        messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
        texts = []
        for turn in range(3):
            messages.append(user_turn(turn))
            result = await kronk.chat(
                messages, model="m", logprobs=True, top_logprobs=5, **sampling
            )
            if turn:
                assert result.usage.cached_tokens > 100
            replay.prefill(await prompt_tokens(kronk, messages), result.usage.cached_tokens)
            assert replay.generate(sampling["max_tokens"], stages) == result.content
            assert_same_logprobs(result, replay)
            texts.append(result.content)
            messages.append({"role": "assistant", "content": result.content})
        # A different seed samples a different answer: the seed is what made them equal.
        other = await kronk.chat(messages[:2], model="m", **{**sampling, "seed": 7})
        assert other.content != texts[0]
    finally:
        replay.close()
        kronk.close()


def host_store(kronk: Kronk) -> HostStore:
    loaded = kronk.get_loaded("m")
    assert isinstance(loaded, LoadedModel)
    store: HostStore = loaded.cache.store  # type: ignore[attr-defined]
    return store


def entries_on_disk(directory: Path) -> list[Path]:
    return sorted(path for path in directory.rglob("*") if path.is_file())


async def test_an_unwritable_host_tier_directory_keeps_conversations_in_ram(
    gemma_path: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The directory turns into something no one can write into under a running model:
    no request fails, evicted conversations stay in RAM and come back from there, and the
    disk is used again once the directory can be made."""
    disk = tmp_path / "kv"
    settings = disk_tier(disk)
    kronk = fresh(gemma_path, tmp_path, **settings)
    try:
        first_turn = conversation(AGENT_SYSTEMS[0], 1)
        first = await ask(kronk, "m", first_turn)
        (directory,) = disk.iterdir()  # the model's fingerprint directory
        directory.rmdir()
        directory.write_text("not a directory")  # even root cannot write into it now
        with caplog.at_level(logging.WARNING, logger="kronk_caching.host_store"):
            other = await ask(kronk, "m", conversation(AGENT_SYSTEMS[1], 1))  # evicts the first
        assert other.usage.completion_tokens > 0
        assert any("keeping conversations in RAM only" in r.message for r in caplog.records)
        assert entries_on_disk(disk) == [directory] and len(host_store(kronk)) == 1
        second_turn = continued(first_turn, first)
        back = await ask(kronk, "m", second_turn)
        assert back.usage.cached_tokens > 100
        assert kronk.get_loaded("m").engine.cache_counters().restores == 1  # type: ignore[union-attr]
        directory.unlink()  # the operator repairs it: the next eviction is written again
        await ask(kronk, "m", conversation(AGENT_SYSTEMS[2], 1))
        assert [p.suffix for p in entries_on_disk(disk)] == [".checkpoints", ".state", ".tokens"]
    finally:
        kronk.close()
    # A directory that cannot be made at all: the model loads and serves, RAM only.
    blocked = tmp_path / "blocked"
    blocked.write_text("a file")
    settings["caching"] = {"host_cache_dir": blocked, "host_cache_bytes": 1 << 30}
    kronk = fresh(gemma_path, tmp_path, **settings)
    try:
        await ask(kronk, "m", conversation(AGENT_SYSTEMS[0], 1))
        await ask(kronk, "m", conversation(AGENT_SYSTEMS[1], 1))
        assert len(host_store(kronk)) == 1 and blocked.read_text() == "a file"
    finally:
        kronk.close()


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Writes past `limit` bytes fail with EFBIG, as a write fails on a full disk."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an error, not a killed process
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


async def test_a_full_disk_leaves_no_half_written_entry(gemma_path: str, tmp_path: Path) -> None:
    """A state too large for what the disk takes: nothing of it stays on disk (a restart
    finds no entry to misread), the conversation stays in RAM and comes back from there."""
    disk = tmp_path / "kv"
    kronk = fresh(gemma_path, tmp_path, **disk_tier(disk))
    try:
        first_turn = conversation(AGENT_SYSTEMS[0], 1)
        first = await ask(kronk, "m", first_turn)
        with file_size_limit(1 << 20):  # the state takes several MiB
            await ask(kronk, "m", conversation(AGENT_SYSTEMS[1], 1))  # evicts the first
        assert entries_on_disk(disk) == [] and len(host_store(kronk)) == 1
        second_turn = continued(first_turn, first)
        back = await ask(kronk, "m", second_turn)  # evicts the second, with room on disk
        assert back.usage.cached_tokens > 100
    finally:
        kronk.close()
    restarted = fresh(gemma_path, tmp_path, **disk_tier(disk))
    try:
        store = host_store(restarted)
        # Only the entry written with room on disk; the first never reached it.
        assert len(store) == 1
        def shared(entry: StoredConversation, prefix: int) -> int:
            return prefix if prefix >= 100 else 0

        assert store.best(await prompt_tokens(restarted, first_turn), shared)[0] == 0
        second = await prompt_tokens(restarted, conversation(AGENT_SYSTEMS[1], 1))
        assert store.best(second, shared)[0] > 100
    finally:
        restarted.close()
