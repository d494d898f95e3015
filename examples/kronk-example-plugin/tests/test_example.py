"""The example plugin, tested the way a third party tests theirs: with the fixtures of
Kronk's pytest plugin (kronk_testing) alone, on the scripted model, without llama.cpp."""

from __future__ import annotations

import httpx

from kronk_api import ServerSettings
from kronk_core import Kronk
from kronk_testing.plugin import MakeServer, ScriptedKronk
from kronk_testing.scripted import Script, ScriptedModel

MODEL = "agent"


def extend_only(scripted_kronk: ScriptedKronk, min_tokens: int = 8) -> Kronk:
    settings = {"cache": "extend-only", "n_seq_max": 1, "example": {"min_tokens": min_tokens}}
    return scripted_kronk({MODEL: settings}, script=Script(default="ok"))


async def test_a_conversation_that_grows_reuses_its_slot(scripted_kronk: ScriptedKronk) -> None:
    kronk = extend_only(scripted_kronk)
    messages = [{"role": "user", "content": "Plan the trip."}]
    first = await kronk.chat(messages)
    assert first.usage.cached_tokens == 0
    messages += [{"role": "assistant", "content": first.content}, {"role": "user", "content": "Go"}]
    second = await kronk.chat(messages)
    # Everything the first request left in the slot, its prompt and answer (but the end
    # token, sampled and never decoded), is the new prompt's start.
    held = first.usage.prompt_tokens + first.usage.completion_tokens
    assert second.usage.cached_tokens == held
    loaded = kronk.get_loaded(MODEL)
    assert loaded is not None and isinstance(loaded.model, ScriptedModel)
    assert loaded.engine.cache_counters().hits == 1


async def test_a_prompt_that_diverges_is_never_cut_back(scripted_kronk: ScriptedKronk) -> None:
    kronk = extend_only(scripted_kronk)
    await kronk.chat([{"role": "user", "content": "Plan the trip."}])
    other = await kronk.chat([{"role": "user", "content": "Plan the party."}])
    assert other.usage.cached_tokens == 0
    loaded = kronk.get_loaded(MODEL)
    assert loaded is not None and isinstance(loaded.model, ScriptedModel)
    slot = loaded.engine.slots[0]
    assert loaded.model.sequence(slot.seq_id) == slot.tokens


async def test_short_prefixes_are_not_worth_keeping(scripted_kronk: ScriptedKronk) -> None:
    kronk = extend_only(scripted_kronk, min_tokens=10_000)
    messages = [{"role": "user", "content": "Hi"}]
    first = await kronk.chat(messages)
    messages += [{"role": "assistant", "content": first.content}, {"role": "user", "content": "?"}]
    assert (await kronk.chat(messages)).usage.cached_tokens == 0


async def test_the_greeting_route_answers_with_the_server_section(
    scripted_kronk: ScriptedKronk, make_server: MakeServer
) -> None:
    settings = ServerSettings.model_validate({"example": {"greeting": "ahoy"}})
    server = make_server(scripted_kronk(), settings)
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        response = await client.get("/v1/example/greeting")
    assert response.status_code == 200
    assert response.json() == {"greeting": "ahoy"}
