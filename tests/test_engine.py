"""The batch engine on the real default model: batching, cancellation, stops, UTF-8, logprobs.

What is bookkeeping alone (the window's limits, the slot's token record, refusals) is
tested on the scripted model, in test_scripted_engine.py.

Everything runs greedy (temperature 0), so outputs are deterministic. The
default model is a base model: its text is junk, but the same junk every time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from kronk_core import FinishReason, Kronk
from kronk_core.contract.types import ChatDelta, TokenLogprob, Usage
from kronk_core.runtime.engine import Engine
from kronk_core.runtime.reports import StepRecord
from kronk_core.sdk import ChatStream
from kronk_testing.waiting import gated, wait_idle, wait_until

GREEDY: dict[str, Any] = {"temperature": 0}

# Prompts whose greedy continuation has a clear winner at every token (checked
# with top_logprobs): llama.cpp's float results depend slightly on how a batch
# is laid out, so a near-tie could flip between "alone" and "batched" runs
# without anything being wrong in Kronk.
STABLE_PROMPTS = (
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "Monday, Tuesday, Wednesday,",
    "2, 4, 6, 8, 10,",
    "one two three four five",
    "The capital of France is",
    "Knock knock. Who's there?",
    "10, 9, 8, 7, 6,",
    "Hello, world!",
)

# Greedy continuations of these run at least 200 tokens without an end-of-turn.
STORY_PROMPTS = tuple(
    f"Tell me a long story about {topic}."
    for topic in ("dragons", "pirates", "robots", "wizards", "the ocean", "a castle")
)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@dataclass
class Collected:
    content: str = ""
    pieces: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    usage: Usage | None = None


async def collect_stream(deltas: AsyncIterable[ChatDelta]) -> Collected:
    """Drain a stream of deltas; content is the concatenation of every delta.content."""
    out = Collected()
    async for delta in deltas:
        assert isinstance(delta.content, str)
        out.pieces.append(delta.content)
        out.logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            out.finish_reason = delta.finish_reason
            out.usage = delta.usage
    out.content = "".join(out.pieces)
    return out


async def run(kronk: Kronk, prompt: str, **params: Any) -> Collected:
    return await collect_stream(kronk.chat_stream(user(prompt), **params))


def engine_of(kronk: Kronk) -> Engine:
    loaded = kronk.get_loaded()
    assert loaded is not None
    return loaded.engine


@contextlib.contextmanager
def step_records(engine: Engine) -> Iterator[list[StepRecord]]:
    """Record every StepRecord the engine emits while the block runs."""
    records: list[StepRecord] = []

    def listener(record: StepRecord) -> None:
        records.append(record)

    engine.add_step_listener(listener)
    try:
        yield records
    finally:
        engine.remove_step_listener(listener)


def prompt_tokens(kronk: Kronk, messages: list[Mapping[str, Any]]) -> list[int]:
    """The exact token ids start_chat puts in front of the model for these messages."""
    loaded = kronk.get_loaded()
    assert loaded is not None
    request = kronk.chat_request(messages)
    return loaded.render(request.messages, kronk.render_options(request))


class Consumer:
    """Drains a started ChatStream in a task; `first_token` is set on its first text."""

    def __init__(self, stream: ChatStream) -> None:
        self.stream = stream
        self.first_token = asyncio.Event()
        self.task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> Collected:
        out = Collected()
        async for delta in self.stream:
            out.pieces.append(delta.content)
            if delta.content:
                self.first_token.set()
            if delta.finish_reason is not None:
                out.finish_reason = delta.finish_reason
                out.usage = delta.usage
        out.content = "".join(out.pieces)
        return out


async def start_consumers(
    kronk: Kronk, prompts: tuple[str, ...], max_tokens: int
) -> list[Consumer]:
    consumers = []
    for prompt in prompts:
        stream = await kronk.start_chat(
            kronk.chat_request(user(prompt), max_tokens=max_tokens, **GREEDY)
        )
        consumers.append(Consumer(stream))
    await asyncio.wait_for(asyncio.gather(*(c.first_token.wait() for c in consumers)), 30)
    return consumers


async def stop_consumers(consumers: list[Consumer]) -> list[Collected]:
    for consumer in consumers:
        consumer.stream.cancel()
    return list(await asyncio.wait_for(asyncio.gather(*(c.task for c in consumers)), 30))


# ---- 1. concurrency --------------------------------------------------------------------


async def test_concurrent_streams_match_sequential_runs(kronk: Kronk) -> None:
    engine = engine_of(kronk)
    assert len(engine.slots) == 4
    params = {"max_tokens": 16, **GREEDY}
    alone = [await run(kronk, prompt, **params) for prompt in STABLE_PROMPTS]

    before = engine.stats().steps
    with step_records(engine) as records:
        # The first is held after its first step until the other seven are queued: however
        # slow the machine, the slots then fill together.
        with gated(engine, lambda record: record.index > before) as gate:
            first = asyncio.ensure_future(run(kronk, STABLE_PROMPTS[0], **params))
            await gate.wait_held()
            rest = [asyncio.ensure_future(run(kronk, p, **params)) for p in STABLE_PROMPTS[1:]]
            await wait_until(lambda: engine.stats().queued == len(rest), timeout=60)
        together = await asyncio.gather(first, *rest)

    assert len(together) == len(STABLE_PROMPTS) == 8
    for prompt, solo, batched in zip(STABLE_PROMPTS, alone, together, strict=True):
        assert batched.finish_reason is not None, prompt
        assert batched.content == solo.content, prompt
        assert batched.finish_reason == solo.finish_reason, prompt
        assert batched.usage == solo.usage, prompt
    # Eight requests on four slots really were batched: four sequences shared a step,
    # and never more than there are slots.
    widest = max(len(r.generating) + len(r.prefilling) for r in records)
    assert widest == 4
    await wait_idle(engine)


# ---- 2. cancellation -------------------------------------------------------------------


async def test_cancel_frees_slot_for_queued_request_within_one_step(kronk: Kronk) -> None:
    engine = engine_of(kronk)
    await wait_idle(engine)
    running: list[Consumer] = []
    with step_records(engine) as records:
        try:
            running = await start_consumers(kronk, STORY_PROMPTS[:4], max_tokens=200)
            assert engine.stats().active == 4
            victim_prompt = prompt_tokens(kronk, user(STORY_PROMPTS[0]))
            victim_slot = next(
                slot for slot in engine.slots if slot.tokens[: len(victim_prompt)] == victim_prompt
            )
            assert victim_slot.busy

            queued_stream = await kronk.start_chat(
                kronk.chat_request(user("Hello, world!"), max_tokens=4, **GREEDY)
            )
            queued = Consumer(queued_stream)
            submitted_at = engine.stats().steps
            # A few steps pass: it stays queued, all slots busy.
            await wait_until(lambda: engine.stats().steps >= submitted_at + 3)
            assert engine.stats().queued == 1
            assert all(slot.busy for slot in engine.slots)

            running[0].stream.cancel()
            # Read right after cancel(): the engine had finished at most this many steps
            # when the cancellation landed.
            cancelled_at = engine.stats().steps
            victim = await asyncio.wait_for(running[0].task, 10)
            result = await asyncio.wait_for(queued.task, 30)
        finally:
            rest = await stop_consumers(running[1:]) if running else []

    assert victim.finish_reason is FinishReason.cancelled
    assert 0 < victim.usage.completion_tokens < 200  # type: ignore[union-attr]
    assert result.finish_reason is FinishReason.length
    assert result.usage is not None and result.usage.completion_tokens == 4
    assert all(r.finish_reason is FinishReason.cancelled for r in rest)

    started = [r for r in records if r.prefilling and r.index > cancelled_at]
    assert started, "the queued request never prefilled"
    first = started[0]
    # The engine may be inside step cancelled_at + 1 when cancel() lands; the very next
    # step after that must already carry the queued prompt.
    assert first.index <= cancelled_at + 2
    # It took the cancelled request's slot (the only one freed), while the other three
    # kept generating in the same step.
    assert list(first.prefilling) == [victim_slot.id]
    assert set(first.generating) == {s.id for s in engine.slots} - {victim_slot.id}
    await wait_idle(engine)


async def test_closing_chat_stream_generator_cancels_request(kronk: Kronk) -> None:
    engine = engine_of(kronk)
    await wait_idle(engine)
    deltas = kronk.chat_stream(user(STORY_PROMPTS[4]), max_tokens=200, **GREEDY)
    seen = 0
    async for delta in deltas:
        seen += bool(delta.content)
        if seen == 3:
            break
    assert engine.stats().active == 1
    await deltas.aclose()  # type: ignore[attr-defined]
    steps_before = engine.stats().steps
    await wait_idle(engine)
    # Freed long before the 200 tokens could have been generated.
    assert engine.stats().steps - steps_before < 50
    assert all(not slot.tokens for slot in engine.slots)


async def test_cancel_seen_after_a_step_starts_queued_request_in_the_next(kronk: Kronk) -> None:
    engine = engine_of(kronk)
    await wait_idle(engine)
    running: list[Consumer] = []
    cancelled_after: list[int] = []
    with step_records(engine) as records:
        try:
            running = await start_consumers(kronk, STORY_PROMPTS[2:6], max_tokens=200)
            queued = Consumer(
                await kronk.start_chat(
                    kronk.chat_request(user("Hello, world!"), max_tokens=2, **GREEDY)
                )
            )

            def cancel_now(record: StepRecord) -> None:
                # Runs on the engine thread right after a step: a deterministic moment. The
                # listener can be called for the step that sampled the first tokens (their
                # deltas may arrive before the engine gets to its listeners), so wait for a
                # step in which all four generate.
                if not cancelled_after and len(record.generating) == 4:
                    cancelled_after.append(record.index)
                    running[0].stream.cancel()

            engine.add_step_listener(cancel_now)
            try:
                victim = await asyncio.wait_for(running[0].task, 10)
            finally:
                engine.remove_step_listener(cancel_now)
            result = await asyncio.wait_for(queued.task, 30)
        finally:
            await stop_consumers(running[1:])

    assert victim.finish_reason is FinishReason.cancelled
    assert result.usage is not None and result.usage.completion_tokens == 2
    (step,) = cancelled_after
    assert set(next(r for r in records if r.index == step).generating) == {0, 1, 2, 3}
    following = next(r for r in records if r.index == step + 1)
    # Reaped and replaced between two steps: the very next step prefills the queued prompt
    # in the freed slot, next to the three requests still generating.
    assert len(following.prefilling) == 1
    (slot_id,) = following.prefilling
    assert set(following.generating) == {0, 1, 2, 3} - {slot_id}
    await wait_idle(engine)


# ---- 3. step composition ---------------------------------------------------------------


async def test_long_prefill_shares_steps_with_generating_streams(kronk: Kronk) -> None:
    engine = engine_of(kronk)
    await wait_idle(engine)
    long_messages = user("word " * 3000)
    n_prompt = await kronk.count_prompt_tokens(
        kronk.chat_request(long_messages), add_generation_prompt=True
    )
    assert 3000 <= n_prompt < 2 * (engine.n_batch - 3)

    running: list[Consumer] = []
    with step_records(engine) as records:
        try:
            running = await start_consumers(kronk, STORY_PROMPTS[:3], max_tokens=120)
            generating_slots = {slot.id for slot in engine.slots if slot.busy}
            assert len(generating_slots) == 3
            (long_slot,) = {s.id for s in engine.slots} - generating_slots
            long_result = await asyncio.wait_for(
                run(kronk, long_messages[0]["content"], max_tokens=1, **GREEDY), 120
            )
            assert all(not c.task.done() for c in running), "streams ended before the prefill"
        finally:
            await stop_consumers(running)

    assert long_result.usage is not None
    assert long_result.usage.prompt_tokens == n_prompt
    assert long_result.usage.completion_tokens == 1
    prefill_steps = [r for r in records if long_slot in r.prefilling]
    assert len(prefill_steps) >= 2
    # Each step is one decode of at most n_batch tokens: the three generating tokens go
    # in first and the prompt chunk fills the rest of the budget.
    chunks = [r.prefilling[long_slot] for r in prefill_steps]
    assert chunks == [engine.n_batch - 3, n_prompt - (engine.n_batch - 3)]
    for record in prefill_steps:
        assert record.generating == dict.fromkeys(generating_slots, 1), record
        assert record.prefilling == {long_slot: record.prefilling[long_slot]}
    # Prefill steps are consecutive: the prompt never waited a step out.
    assert [r.index for r in prefill_steps] == list(
        range(prefill_steps[0].index, prefill_steps[0].index + len(prefill_steps))
    )
    await wait_idle(engine)


# ---- 4. stop strings -------------------------------------------------------------------


async def test_stop_string_spanning_token_boundary_is_cut_exactly(kronk: Kronk) -> None:
    prompt = "The capital of France is"
    full = await run(kronk, prompt, max_tokens=12, logprobs=True, **GREEDY)
    tokens = [entry.token for entry in full.logprobs]
    assert full.usage is not None and full.usage.completion_tokens == 12
    assert "".join(tokens) == full.content
    text = full.content
    boundary = len("".join(tokens[:4]))  # where the 5th token begins
    assert len(tokens[4]) >= 2

    cases = [
        # two characters on either side of the boundary between tokens 4 and 5:
        # completed by token 5
        (text[boundary - 2 : boundary + 2], boundary - 2, 5),
        # a stop spanning three tokens (end of token 4, all of 5, start of 6):
        # completed by token 6
        (text[boundary - 1 : boundary + len(tokens[4]) + 1], boundary - 1, 6),
    ]
    for stop, first_at, tokens_needed in cases:
        assert text.index(stop) == first_at, stop  # its first occurrence is the one we chose
        stopped = await run(kronk, prompt, max_tokens=12, stop=[stop], **GREEDY)
        assert stopped.content == text[: text.index(stop)], stop
        assert stopped.finish_reason is FinishReason.stop
        # generation ended on the very token that completed the stop string
        assert stopped.usage is not None
        assert stopped.usage.completion_tokens == tokens_needed

    never = await run(kronk, prompt, max_tokens=12, stop=["<<never-there>>", "zzqq"], **GREEDY)
    assert never.content == text
    assert never.finish_reason is FinishReason.length
    assert never.usage == full.usage


async def test_earliest_of_two_stop_strings_wins(kronk: Kronk) -> None:
    prompt = "Python is a programming language."
    full = await run(kronk, prompt, max_tokens=10, **GREEDY)
    text = full.content
    late, early = "language", " a pro"
    assert text.index(early) < text.index(late)
    stopped = await run(kronk, prompt, max_tokens=10, stop=[late, early], **GREEDY)
    assert stopped.content == text[: text.index(early)]
    assert stopped.finish_reason is FinishReason.stop


# ---- 5. UTF-8 --------------------------------------------------------------------------


async def test_multibyte_characters_split_across_tokens_stream_whole(kronk: Kronk) -> None:
    # Rare CJK characters are byte-fallback tokens: one character spans several tokens.
    prompt = "漢字の練習：鬱、麤、龘、𠮷"
    streamed = await run(kronk, prompt, max_tokens=24, logprobs=True, **GREEDY)
    assert streamed.usage is not None and streamed.usage.completion_tokens == 24
    partial_tokens = [entry.token for entry in streamed.logprobs if "\ufffd" in entry.token]
    assert partial_tokens, "expected byte-fallback tokens that split a character"
    for piece in streamed.pieces:
        assert "\ufffd" not in piece
        piece.encode("utf-8")  # valid, no lone surrogates
    assert "麤" in streamed.content and "龘" in streamed.content and "𠮷" in streamed.content

    whole = await kronk.chat(user(prompt), max_tokens=24, **GREEDY)
    assert whole.content == streamed.content
    assert whole.finish_reason is FinishReason.length


# ---- 6. logprobs -----------------------------------------------------------------------


async def test_logprobs_one_entry_per_token_and_greedy_is_top(kronk: Kronk) -> None:
    # DRY off: then greedy picks the raw arg-max, the token top_logprobs[0] describes.
    result = await kronk.chat(
        user("Python is a programming language."),
        max_tokens=10,
        logprobs=True,
        top_logprobs=5,
        dry_multiplier=0,
        **GREEDY,
    )
    assert result.usage.completion_tokens == 10
    assert len(result.logprobs) == result.usage.completion_tokens
    assert "".join(entry.token for entry in result.logprobs) == result.content
    for entry in result.logprobs:
        assert entry.logprob <= 0.0
        top = entry.top_logprobs
        assert 1 <= len(top) <= 5
        assert [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)
        assert all(t.logprob <= 0.0 for t in top)
        assert entry.token == top[0].token
        assert entry.logprob == pytest.approx(top[0].logprob, abs=1e-6)
        assert entry.bytes == tuple(entry.token.encode("utf-8"))


async def test_logprobs_without_top_alternatives(kronk: Kronk) -> None:
    result = await kronk.chat(user("Hello, world!"), max_tokens=5, logprobs=True, **GREEDY)
    assert len(result.logprobs) == result.usage.completion_tokens == 5
    assert all(entry.top_logprobs == () for entry in result.logprobs)
    plain = await kronk.chat(user("Hello, world!"), max_tokens=5, **GREEDY)
    assert plain.logprobs == []
    assert plain.content == result.content


# ---- 7. raw prompts and logit bias ------------------------------------------------------


async def test_sdk_completes_a_raw_prompt(kronk: Kronk) -> None:
    prompt = "<start_of_turn>user\nSay hello.<end_of_turn>\n<start_of_turn>model\n"
    result = await kronk.complete(prompt, max_tokens=6, temperature=0, logprobs=True)
    assert result.content and result.reasoning == ""
    assert len(result.logprobs) == result.usage.completion_tokens
    question = [{"role": "user", "content": "Say hello."}]
    chat = await kronk.chat(question, max_tokens=6, temperature=0)
    # The template renders this prompt (BOS included): the same prompt, the same answer.
    assert result.usage.prompt_tokens == chat.usage.prompt_tokens
    assert result.content.strip() == chat.content.strip()
    pieces = [d.content async for d in kronk.complete_stream(prompt, max_tokens=6, temperature=0)]
    assert "".join(pieces) == result.content
    ids = await kronk.tokenize(prompt)
    by_ids = await kronk.complete(ids, max_tokens=1)
    assert by_ids.usage.prompt_tokens == len(ids)  # ids as they are: no BOS added


async def test_logit_bias_forces_and_bans_tokens(kronk: Kronk) -> None:
    (banana,) = await kronk.tokenize(" banana")
    messages = [{"role": "user", "content": "Count from 1 to 5."}]
    forced = await kronk.chat(messages, max_tokens=3, temperature=0, logit_bias={banana: 100})
    assert forced.content == " banana" * 3
    plain = await kronk.complete("One, two,", max_tokens=1, temperature=0)
    (first,) = await kronk.tokenize(plain.content)
    banned = await kronk.complete(
        "One, two,", max_tokens=1, temperature=0, logit_bias={first: -100}
    )
    assert banned.content != plain.content
    # Sampled: a banned token is never drawn.
    for seed in range(5):
        drawn = await kronk.complete(
            "One, two,", max_tokens=1, temperature=1.0, seed=seed, logit_bias={first: -100}
        )
        assert drawn.content != plain.content
