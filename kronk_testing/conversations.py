"""Conversations for the caching tests: a long system prompt (SYSTEM, and one per sub-agent in
AGENT_SYSTEMS), numbered user turns, and a Kronk serving a chat model as "m" (`fresh`) whose
greedy answers a cold replay (kronk_testing.replay) reproduces.

The caching plugin's tests share them (test_caching.py, test_recurrent.py,
test_host_tier_files.py, and host_tier_writer.py, the process test_caching.py kills).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_core.contract import ChatResult

# DRY off: greedy is then a pure argmax, which the replays (kronk_testing.replay) reproduce. Each
# model renders its own template (Gemma's picked by its architecture, SmolLM2's from its GGUF).
BASE = {
    "context_window": 4096,
    "sampling": {"dry_multiplier": 0.0},
    # The cold replays decode what each engine step decoded: one token per generating slot
    # (speculation's exactness is plugins/speculative/tests/test_speculative.py's).
    "draft_strategy": "none",
}
SYSTEM = (
    "You are the ship's computer of the research vessel Kestrel. Answer crew questions about "
    "navigation, weather, cargo and the ship's systems. Be brief and precise. "
) * 6
TOPICS = [
    "the current heading and speed of the ship",
    "the forecast for the next twelve hours at our position",
    "how much fresh water is left in the tanks",
    "the status of the port engine after yesterday's repair",
    "which cargo containers hold the sampling equipment",
    "the nearest harbour with a repair dock",
    "the fuel consumption at our current speed",
    "the crew rota for the night watch",
    "the battery charge of the survey drone",
    "when we will reach the first sampling station",
]


def user_turn(index: int) -> dict[str, str]:
    detail = " Please include every figure you know and explain how it was measured." * 2
    return {"role": "user", "content": f"Turn {index}: tell me about {TOPICS[index % 10]}.{detail}"}


def model_config(path: str | Path, **settings: Any) -> ModelConfig:
    return ModelConfig.model_validate({"model_path": path, **BASE, **settings})


# Each answer's length at most (an instruction-tuned model often ends sooner).
MAX_TOKENS = 12


async def ask(kronk: Kronk, model: str, messages: list[dict[str, str]], **extra: Any) -> ChatResult:
    return await kronk.chat(
        messages,
        model=model,
        max_tokens=MAX_TOKENS,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
        **extra,
    )


def fresh(path: str | Path, tmp_path: Path, **settings: Any) -> Kronk:
    """A Kronk serving the model at `path` as "m" (two slots unless `settings` say)."""
    settings = {"n_seq_max": 2, **settings}
    config = KronkConfig(base_path=tmp_path, models={"m": model_config(path, **settings)})
    kronk = Kronk(config)
    kronk.load("m")
    return kronk


def conversation(system: str, turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}]
    for turn in range(turns):
        messages.append(user_turn(turn))
        if turn < turns - 1:
            messages.append({"role": "assistant", "content": f"Answer {turn}: noted."})
    return messages


def continued(messages: list[dict[str, str]], answer: ChatResult) -> list[dict[str, str]]:
    """The conversation with its answer and the next user turn."""
    turn = sum(1 for message in messages if message["role"] == "user")
    return [*messages, {"role": "assistant", "content": answer.content}, user_turn(turn)]


def slot_of(kronk: Kronk, prompt: list[int]) -> int:
    """The slot that answered this prompt last (its tokens begin with all of it)."""
    loaded = kronk.get_loaded("m")
    assert loaded is not None and loaded.engine is not None
    (slot,) = [slot.id for slot in loaded.engine.slots if slot.tokens[: len(prompt)] == prompt]
    return slot


async def prompt_tokens(kronk: Kronk, messages: list[dict[str, str]]) -> list[int]:
    """The tokens model "m" renders `messages` to."""
    loaded = kronk.get_loaded("m")
    assert loaded is not None
    request = kronk.chat_request(messages)
    return loaded.render(request.messages, kronk.render_options(request))


AGENT_SYSTEMS = [f"You are sub-agent {name}. " + SYSTEM for name in ("Alpha", "Bravo", "Charlie")]
