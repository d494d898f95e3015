"""Context shift, as llama-server does it: a generation that fills the window keeps the first
`n_keep` tokens, drops half of the rest and goes on. Checked against a replay that decodes
the same prompt on a context of its own and shifts it with llama.cpp's own calls; models
whose KV cannot shift refuse the setting at load."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import llama_cpp
import ollama
import pytest

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_core.contract.backend import Batch
from kronk_core.contract.errors import ConfigError
from kronk_core.contract.types import FinishReason, TokenLogprob
from kronk_llamacpp.packaged import default_model_path, gemma_model_path
from kronk_testing import scripted
from kronk_testing.models.recurrent import TINY_MAMBA2
from kronk_testing.replay import GREEDY, ColdReplay, assert_same_logprobs
from kronk_testing.server import Serve

pytestmark = pytest.mark.model

WINDOW = 256
PROMPT = "Counting up, one number a line:\n1\n2\n3\n4\n5\n6\n7\n"
KEEP = 8  # prompt tokens kept, after any BOS
ANSWER = 600  # more than two windows: it shifts at least three times


def shifting(**settings: object) -> ModelConfig:
    """SmolLM2 in one slot of WINDOW tokens, shifting; greedy is a pure argmax (DRY off) and
    one token per decode (no speculation), as the replay decodes."""
    return ModelConfig.model_validate(
        {
            "model_path": default_model_path(),
            "context_window": WINDOW,
            "n_seq_max": 1,
            "context_shift": True,
            "draft_strategy": "none",
            "sampling": {"dry_multiplier": 0.0},
            **settings,
        }
    )


@pytest.fixture(scope="module")
def kronk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kronk]:
    models = {"m": shifting(), "speculating": shifting(draft_strategy="lookup")}
    config = KronkConfig(base_path=tmp_path_factory.mktemp("shift"), models=models)
    with Kronk(config) as kronk:
        yield kronk


def shifted_replay(
    config: ModelConfig, prompt: list[int], keep: int, answer: int, *, off_by: int = 0
) -> list[TokenLogprob]:
    """Greedy on a context of its own: the prompt in one chunk, then one token per decode;
    whenever the next token would fill the window, llama.cpp's own calls drop half of what
    follows the kept tokens (`off_by` more) and move the rest back."""
    replay = ColdReplay(config)
    model = replay.model
    memory = llama_cpp.llama_get_memory(model._ctx)
    sampler = model.new_sampler(GREEDY)
    try:
        replay.prefill(prompt, 0)
        index, length, picked = replay._index, len(prompt), []
        for produced in range(answer):
            token = sampler.sample(index)
            picked.append(model.logprobs(index, token, 5))
            if produced == answer - 1:
                break
            if length + 1 >= WINDOW:
                discard = (length - keep) // 2 + off_by
                assert llama_cpp.llama_memory_seq_rm(memory, 0, keep, keep + discard)
                llama_cpp.llama_memory_seq_add(memory, 0, keep + discard, length, -discard)
                length -= discard
            batch = Batch()
            index = batch.add(token, length, 0, True)
            model.decode(batch)
            length += 1
        return picked
    finally:
        sampler.close()
        replay.close()


async def test_a_generation_past_the_window_shifts_and_matches_the_replay(kronk: Kronk) -> None:
    result = await kronk.complete(
        PROMPT, model="m", max_tokens=ANSWER, temperature=0, logprobs=True, n_keep=KEEP
    )
    assert result.finish_reason is FinishReason.length
    assert result.usage.completion_tokens == ANSWER > 2 * WINDOW
    loaded = kronk.get_loaded("m")
    assert loaded is not None
    prompt = loaded.model.tokenize(PROMPT, add_special=True, parse_special=True)
    bos = len(loaded.model.tokenize("", add_special=True, parse_special=False))
    keep = bos + KEEP
    expected = shifted_replay(loaded.config, prompt, keep, ANSWER)
    assert_same_logprobs(result, expected, tolerance=1e-4)
    # Had it dropped one token more each time, the answer would be another.
    other = shifted_replay(loaded.config, prompt, keep, ANSWER, off_by=1)
    parted = max(
        abs(ours.logprob - theirs.logprob)
        for ours, theirs in zip(result.logprobs, other, strict=True)
    )
    assert parted > 1e-2
    # What follows the kept tokens was moved: the slot, record and KV, keeps only those.
    (slot,) = loaded.engine.slots
    assert slot.tokens == prompt[:keep]
    memory = llama_cpp.llama_get_memory(loaded.model._ctx)
    assert llama_cpp.llama_memory_seq_pos_max(memory, slot.seq_id) == keep - 1


async def test_speculation_drafts_across_shifts_and_answers_the_same(kronk: Kronk) -> None:
    """Prompt lookup drafts from the slot's shifted context: the greedy answer is the
    one-token-a-step answer's, with drafts standing on both sides of every shift."""
    prompt = "The bell rang, and the cat sat on the mat. " * 6
    plain = await kronk.complete(prompt, model="m", max_tokens=ANSWER, temperature=0, n_keep=KEEP)
    drafted = await kronk.complete(
        prompt, model="speculating", max_tokens=ANSWER, temperature=0, n_keep=KEEP
    )
    assert drafted.usage.completion_tokens == ANSWER
    assert drafted.usage.accepted_prediction_tokens > ANSWER // 2
    assert drafted.content == plain.content


async def test_n_keep_minus_one_keeps_the_whole_prompt(kronk: Kronk) -> None:
    result = await kronk.complete(
        PROMPT, model="m", max_tokens=WINDOW + 40, temperature=0, logprobs=True, n_keep=-1
    )
    assert result.usage.completion_tokens == WINDOW + 40
    loaded = kronk.get_loaded("m")
    assert loaded is not None
    prompt = loaded.model.tokenize(PROMPT, add_special=True, parse_special=True)
    assert_same_logprobs(
        result, shifted_replay(loaded.config, prompt, len(prompt), WINDOW + 40), tolerance=1e-4
    )


def test_the_server_shifts_with_llama_servers_n_keep_and_ollamas_num_keep(
    tmp_path: Path, serve: Serve
) -> None:
    models = tmp_path / "models.yaml"
    models.write_text(
        f"models:\n  m:\n    model_path: {default_model_path()}\n    context_window: {WINDOW}\n"
        f"    n_seq_max: 1\n    context_shift: true\n  plain:\n"
        f"    model_path: {default_model_path()}\n    context_window: {WINDOW}\n"
        f"    n_seq_max: 1\n"
    )
    app = create_app(ServerSettings(base_path=tmp_path, model_config_file=models))
    with serve(app) as base_url:
        body = {"prompt": PROMPT, "max_tokens": WINDOW + 20, "temperature": 0, "n_keep": KEEP}
        shifted = httpx.post(f"{base_url}/v1/completions", json={**body, "model": "m"}, timeout=300)
        assert shifted.status_code == 200, shifted.text
        assert shifted.json()["usage"]["completion_tokens"] == WINDOW + 20
        assert shifted.json()["choices"][0]["finish_reason"] == "length"
        # Without the setting the window ends the answer, as before.
        plain = httpx.post(
            f"{base_url}/v1/completions", json={**body, "model": "plain"}, timeout=300
        )
        assert plain.status_code == 200, plain.text
        assert plain.json()["usage"]["completion_tokens"] < WINDOW
        # Ollama's num_keep, through its own client.
        answer = ollama.Client(host=base_url).generate(
            model="m",
            prompt=PROMPT,
            raw=True,
            options={"num_predict": WINDOW + 20, "temperature": 0, "num_keep": KEEP},
        )
        assert (answer.eval_count, answer.done_reason) == (WINDOW + 20, "length")
        refused = httpx.post(
            f"{base_url}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "n_keep": -2},
            timeout=60,
        )
        assert refused.status_code == 400, refused.text
        assert "n_keep" in refused.text


@pytest.mark.parametrize(
    ("model", "why"),
    [
        ("gemma", "sliding-window attention"),
        ("recurrent", "recurrent state"),
        ("scripted", "cannot move positions"),
    ],
)
def test_a_model_that_cannot_shift_refuses_the_setting_at_load(
    model: str, why: str, tmp_path: Path, recurrent_models: dict[str, Path]
) -> None:
    entry: dict[str, object] = {
        "gemma": {"model_path": gemma_model_path()},
        "recurrent": {"model_path": recurrent_models[TINY_MAMBA2]},
        "scripted": {
            "backend": scripted.BACKEND,
            "model_path": scripted.write_script(tmp_path / "script.json", scripted.Script()),
        },
    }[model]
    config = KronkConfig(base_path=tmp_path, models={"m": {**entry, "context_shift": True}})
    plugins = {"scripted": scripted} if model == "scripted" else None
    with Kronk(config, plugins=plugins) as kronk, pytest.raises(ConfigError) as refused:
        kronk.load("m")
    assert "models.m.context_shift" in str(refused.value) and why in str(refused.value)
