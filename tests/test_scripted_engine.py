"""The engine and the model pool on the harness's scripted model (kronk_testing.scripted):
admission, cancellation, LRU and TTL unloading, context trimming, the window's limits, the
slot's token record and the SDK's refusals, without llama.cpp.

The scripted model holds decodes while paused and lets them through one at a time, so
every state below is reached by condition, never by the machine's speed; its KV records
token ids, so the slots' bookkeeping is compared with what the model holds.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kronk_core import Kronk
from kronk_core.contract.cache import PromptScope
from kronk_core.contract.errors import ContextOverflowError, InvalidRequestError, QueueFullError
from kronk_core.prompts import prepare_chat
from kronk_core.runtime.engine import StepRecord
from kronk_core.runtime.loading import LoadedModel
from kronk_testing.plugin import SCRIPTED_MODEL_ID, ScriptedKronk
from kronk_testing.scripted import N_VOCAB, Script, ScriptedModel, digest, tokenize
from kronk_testing.waiting import wait_until

REPLY = Script().default


def loaded(kronk: Kronk, model_id: str = SCRIPTED_MODEL_ID) -> tuple[LoadedModel, ScriptedModel]:
    model = kronk.get_loaded(model_id)
    assert model is not None and isinstance(model.model, ScriptedModel)
    return model, model.model


def ask(kronk: Kronk, text: str, **params: Any) -> asyncio.Task[Any]:
    return asyncio.ensure_future(kronk.chat([{"role": "user", "content": text}], **params))


async def test_answers_from_its_script_and_the_kv_matches_the_slot(
    scripted_kronk: ScriptedKronk,
) -> None:
    script = Script(replies=(("ping", "pong: {tokens} tokens, {digest}"),))
    kronk = scripted_kronk({"m": {"n_seq_max": 1, "cache": "imc"}}, script=script)
    result = await kronk.chat([{"role": "user", "content": "ping"}])
    prompt = tokenize("<|im_start|>user\nping<|im_end|>\n<|im_start|>assistant\n")
    assert result.content == f"pong: {len(prompt)} tokens, {digest(prompt)}"
    assert result.usage.prompt_tokens == len(prompt)
    engine_model, model = loaded(kronk, "m")
    # IMC kept the conversation: the KV holds the prompt and the answer, as the slot says.
    slot = engine_model.engine.slots[0]
    assert model.sequence(slot.seq_id) == slot.tokens
    assert slot.tokens[: len(prompt)] == prompt
    assert len(slot.tokens) == len(prompt) + result.usage.completion_tokens


async def test_more_requests_than_slots_wait_in_the_queue(fake_kronk: Kronk) -> None:
    engine_model, model = loaded(fake_kronk)
    engine = engine_model.engine
    busy: list[int] = []

    def count(record: StepRecord) -> None:
        busy.append(len(record.generating) + len(record.prefilling))

    engine.add_step_listener(count)
    model.pause()
    tasks = [ask(fake_kronk, "question 0")]
    await wait_until(lambda: model.held)
    # The first request is decoding (held): the others wait, a slot free or not.
    tasks += [ask(fake_kronk, f"question {n}") for n in range(1, 5)]
    await wait_until(lambda: engine.stats().queued == 4)
    assert engine.stats().active == 1
    model.allow(1)
    # Its prefill done, the engine admits one more into the second slot, and no third.
    await wait_until(lambda: model.held and engine.stats().active == 2)
    assert engine.stats().queued == 3
    assert all(slot.busy for slot in engine.slots)
    model.resume()
    results = await asyncio.gather(*tasks)
    assert [result.content for result in results] == [REPLY] * 5
    assert max(busy) == 2
    assert engine.stats().queued == engine.stats().active == 0


async def test_a_full_queue_refuses_the_request(scripted_kronk: ScriptedKronk) -> None:
    kronk = scripted_kronk(
        {"m": {"n_seq_max": 1, "queue_depth": 1, "cache": "none"}}, queue_wait_seconds=0.05
    )
    kronk.load("m")
    engine_model, model = loaded(kronk, "m")
    model.pause()
    running = ask(kronk, "first")
    await wait_until(lambda: model.held)
    waiting = ask(kronk, "second")
    await wait_until(lambda: engine_model.engine.stats().queued == 1)
    with pytest.raises(QueueFullError):
        await kronk.chat([{"role": "user", "content": "third"}])
    model.resume()
    assert [(await running).content, (await waiting).content] == [REPLY, REPLY]


async def test_a_request_waiting_for_room_enters_when_one_leaves_the_queue(
    scripted_kronk: ScriptedKronk,
) -> None:
    kronk = scripted_kronk(
        {"m": {"n_seq_max": 1, "queue_depth": 1, "cache": "none"}}, queue_wait_seconds=60
    )
    kronk.load("m")
    engine_model, model = loaded(kronk, "m")
    engine = engine_model.engine
    model.pause()
    running = ask(kronk, "first")
    await wait_until(lambda: model.held)
    queued = ask(kronk, "second")
    await wait_until(lambda: engine.stats().queued == 1)
    waiting = ask(kronk, "third")  # the queue is full: it waits for room
    await wait_until(lambda: len(engine._room_waiters) == 1)
    queued.cancel()  # room: the third is woken into the queue
    await wait_until(lambda: queued.done() and engine.stats().queued == 1)
    model.resume()
    assert [(await running).content, (await waiting).content] == [REPLY, REPLY]


async def test_cancelled_requests_free_their_slot_and_leave_the_queue(fake_kronk: Kronk) -> None:
    engine_model, model = loaded(fake_kronk)
    engine = engine_model.engine
    model.pause()
    stream = await fake_kronk.start_chat(
        fake_kronk.chat_request([{"role": "user", "content": "stream"}])
    )
    # Held in its prefill before the others arrive, or one step could admit two.
    await wait_until(lambda: model.held)
    other = ask(fake_kronk, "other")
    queued = ask(fake_kronk, "queued")
    await wait_until(lambda: engine.stats().active == 1 and engine.stats().queued == 2)
    # The queued request goes at once, without a decode.
    queued.cancel()
    await wait_until(lambda: engine.stats().queued == 1)
    # The running one: its prefill and first token, then the consumer leaves.
    model.allow(2)
    async for first in stream:
        assert first.content
        break  # leaving the iteration cancels the request
    model.resume()
    assert (await other).content == REPLY
    await wait_until(lambda: engine.stats().active == 0)
    assert not any(slot.busy for slot in engine.slots)
    # `none` cleared every sequence; the cancelled one holds nothing of its answer.
    assert [model.sequence(slot.seq_id) for slot in engine.slots] == [[], []]
    assert engine.stats().generated_tokens < 2 * len(tokenize(REPLY)) + 1


async def test_the_least_recently_used_model_makes_room(scripted_kronk: ScriptedKronk) -> None:
    kronk = scripted_kronk({"a": {}, "b": {}, "c": {}}, models_in_cache=2, cache_ttl=0)
    for model_id in ("a", "b", "a"):
        await kronk.chat([{"role": "user", "content": "hi"}], model=model_id)
    _, b = loaded(kronk, "b")
    await kronk.chat([{"role": "user", "content": "hi"}], model="c")
    assert sorted(model.id for model in kronk.loaded_models()) == ["a", "c"]
    assert b.closed


async def test_an_idle_model_unloads_after_its_ttl_and_a_busy_one_stays(
    scripted_kronk: ScriptedKronk,
) -> None:
    kronk = scripted_kronk({"a": {}}, cache_ttl=0.2)
    # Held until the request keeps it busy: an idle moment between the load and the
    # request (a busy machine's 0.2 s) would let it expire before the test begins.
    with await kronk.lease("a"):
        _, model = loaded(kronk, "a")
        model.pause()
        task = ask(kronk, "hold on")
        await wait_until(lambda: model.held)
    await asyncio.sleep(1.0)  # five TTLs, busy the whole time
    assert kronk.get_loaded("a") is not None
    model.resume()
    assert (await task).content == REPLY
    await wait_until(lambda: kronk.get_loaded("a") is None)
    # The pool closes an expired model after it left the pool, outside its lock.
    await wait_until(lambda: model.closed)


async def test_trimming_drops_the_oldest_messages_the_model_never_sees(
    scripted_kronk: ScriptedKronk,
) -> None:
    kronk = scripted_kronk(
        {"m": {"context_window": 160, "context_overflow": "trim", "cache": "none"}},
        script=Script(default="{tokens} {digest}"),
    )
    system = {"role": "system", "content": "Be brief."}
    turns = [
        {"role": role, "content": f"message {n}: " + "x" * 30}
        for n, role in enumerate(["user", "assistant"] * 3 + ["user"])
    ]

    def prompt(messages: list[dict[str, str]]) -> list[int]:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return tokenize(text + "<|im_start|>assistant\n")

    max_tokens = 20
    assert len(prompt([system, *turns])) + max_tokens > 160
    # The fewest oldest messages dropped so that the rest and the answer fit.
    fits = [n for n in range(len(turns)) if len(prompt([system, *turns[n:]])) + max_tokens <= 160]
    dropped = fits[0]
    kept = prompt([system, *turns[dropped:]])
    result = await kronk.chat([system, *turns], max_tokens=max_tokens)
    assert dropped >= 1
    assert result.content == f"{len(kept)} {digest(kept)}"
    assert result.usage.prompt_tokens == len(kept)
    assert result.usage.dropped_tokens == len(prompt([system, *turns])) - len(kept)


async def test_a_models_stop_ends_its_answer_as_its_end_of_turn_does(
    scripted_kronk: ScriptedKronk,
) -> None:
    """`stop` in the model's config: the answer ends there, reported as a natural end (no
    stop sequence: the client did not ask for it); a request's own stop still reports."""
    script = Script(default="Hello there. mendatang user: more of the same")
    kronk = scripted_kronk({SCRIPTED_MODEL_ID: {"stop": [" mendatang"]}}, script=script)
    answer = await kronk.chat([{"role": "user", "content": "hi"}], max_tokens=64)
    assert (answer.content, answer.finish_reason.value, answer.stop_sequence) == (
        "Hello there.", "stop", None,
    )  # fmt: skip
    asked = await kronk.chat([{"role": "user", "content": "hi"}], max_tokens=64, stop=["there"])
    assert (asked.content, asked.stop_sequence) == ("Hello ", "there")
    raw = await kronk.complete("hi", max_tokens=64)
    assert raw.content == "Hello there."


async def test_a_model_that_opens_a_new_turn_has_ended_its_own(
    scripted_kronk: ScriptedKronk,
) -> None:
    """The template's turn opener (ChatML's <|im_start|>) generated ends the answer as the
    end-of-turn token would: a model that never closes its turn still stops there."""
    script = Script(default="Hello.<|im_start|>user\nand it goes on")
    kronk = scripted_kronk(script=script)
    kronk.load()
    model, _ = loaded(kronk)
    assert model.template.turn_opener == "<|im_start|>"
    answer = await kronk.chat([{"role": "user", "content": "hi"}], max_tokens=64)
    assert (answer.content, answer.finish_reason.value) == ("Hello.", "stop")


# ---- the window's limits and the slot's token record --------------------------------


def chat_prompt(text: str) -> list[int]:
    """The ids the scripted model's ChatML template gives one user message."""
    return tokenize(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


async def test_max_tokens_past_the_window_is_capped_by_it(fake_kronk: Kronk) -> None:
    """A max_tokens beyond what the window has left is no error: generation may run to the
    window's end (Claude Code asks for 32000 on any model)."""
    engine_model, model = loaded(fake_kronk)
    window = model.info.n_ctx_per_seq
    assert window == Script().context_length
    messages = [{"role": "user", "content": "Knock knock."}]
    room = window - len(chat_prompt("Knock knock."))
    for asked, allowed in ((32000, room), (room, room), (5, 5)):
        request = fake_kronk.chat_request(messages, max_tokens=asked)
        prepared = prepare_chat(engine_model, request, PromptScope())
        assert prepared.generation.max_tokens == allowed


async def test_a_prompt_alone_longer_than_the_window_is_refused(fake_kronk: Kronk) -> None:
    engine_model, model = loaded(fake_kronk)
    text = "word " * 1000
    n_prompt = len(chat_prompt(text))
    assert n_prompt > model.info.n_ctx_per_seq
    with pytest.raises(ContextOverflowError) as info:
        await fake_kronk.start_chat(fake_kronk.chat_request([{"role": "user", "content": text}]))
    assert str(n_prompt) in str(info.value)
    assert str(model.info.n_ctx_per_seq) in str(info.value)
    assert engine_model.engine.stats().queued == engine_model.engine.stats().active == 0
    assert model.decodes == 0


async def test_the_slot_records_the_prompt_and_each_decoded_token(fake_kronk: Kronk) -> None:
    engine_model, model = loaded(fake_kronk)
    engine = engine_model.engine
    prompt = chat_prompt("Monday, Tuesday, Wednesday,")
    snapshots: list[tuple[int, list[int]]] = []  # (step index, the busy slot's tokens)

    def listener(record: StepRecord) -> None:
        for slot in engine.slots:
            if slot.busy:
                snapshots.append((record.index, list(slot.tokens)))
                assert model.sequence(slot.seq_id) == slot.tokens

    engine.add_step_listener(listener)
    try:
        messages = [{"role": "user", "content": "Monday, Tuesday, Wednesday,"}]
        result = await fake_kronk.chat(messages, max_tokens=12, logprobs=True)
    finally:
        engine.remove_step_listener(listener)

    assert result.usage.completion_tokens == len(result.logprobs) == 12
    # After step k (k = 0 is the prefill) the slot holds the prompt and k generated tokens:
    # everything sampled so far but the newest, not yet decoded. The step that samples the
    # 12th token finishes the request and clears the slot, so the last snapshot is step 10.
    assert [len(tokens) for _, tokens in snapshots] == [len(prompt) + k for k in range(11)]
    assert all(tokens[: len(prompt)] == prompt for _, tokens in snapshots)
    assert snapshots[-1][1][len(prompt) :] == tokenize(REPLY)[:10]
    first = snapshots[0][0]
    assert [index for index, _ in snapshots] == list(range(first, first + 11))
    # The `none` cache strategy: the finished request leaves nothing behind.
    await wait_until(lambda: engine.stats().active == 0)
    assert all(slot.tokens == [] == model.sequence(slot.seq_id) for slot in engine.slots)


@pytest.mark.parametrize(
    ("prompt", "params", "error"),
    [
        ("", {}, "prompt must not be empty"),
        (["text"], {}, "a string or token ids"),
        ([1, 99_999_999], {}, "not in the vocabulary"),
        ("Hello", {"stop": ""}, "must not be empty"),
        ("word " * 1000, {}, "context window"),
    ],
    ids=["empty", "not_ids", "outside_vocabulary", "empty_stop", "too_long"],
)
async def test_the_sdk_refuses_a_bad_completion(
    fake_kronk: Kronk, prompt: Any, params: dict[str, Any], error: str
) -> None:
    with pytest.raises(InvalidRequestError, match=error) as caught:
        await fake_kronk.complete(prompt, **params)
    assert caught.value.param in ("prompt", "stop")
    assert loaded(fake_kronk)[1].decodes == 0


@pytest.mark.parametrize(
    ("bias", "error"),
    [
        ({"7": 1.0}, "keys must be token ids"),
        ({7: 101.0}, "between -100 and 100"),
        ({N_VOCAB: 1.0}, "not in the vocabulary"),
    ],
    ids=["text_key", "out_of_range", "outside_vocabulary"],
)
async def test_logit_bias_refusals(fake_kronk: Kronk, bias: Any, error: str) -> None:
    with pytest.raises(InvalidRequestError, match=error) as caught:
        await fake_kronk.chat([{"role": "user", "content": "Hi"}], max_tokens=1, logit_bias=bias)
    assert caught.value.param == "logit_bias"
