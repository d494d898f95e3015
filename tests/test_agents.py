"""Ready for agents: a model without `context_window` gets its training length (at most the
server's `context_window`, lowered to what fits in memory), `/v1/models` says how long each
context is and whether the model is loaded, aliases answer to the names agents insist on in
every dialect, and the first requests of Cline and Open WebUI (Cline's 15-20k tokens, its
tools in the prompt, streaming) are served on a model left at its default context. Claude
Code's, Codex's and OpenCode's captured first requests are served on a default context in
test_agent_dialects.py.

The model is the real Gemma 3 270M (a 32k training length) with one slot, so that its
default-sized context stays small in memory."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import pytest
from openai import OpenAI

from kronk_api import ServerSettings, create_app
from kronk_api.options import ServerStartCommand
from kronk_core import Kronk, KronkConfig
from kronk_core.contract.errors import ConfigError, InsufficientMemoryError
from kronk_core.contract.memory import Device
from kronk_core.settings.config import ModelConfig
from kronk_llamacpp.estimate import (
    MIN_CONTEXT_WINDOW,
    choose_context,
    estimate,
    kv_bytes_per_token,
    refuse_if_too_large,
)
from kronk_llamacpp.gguf_meta import read_metadata
from kronk_llamacpp.packaged import DEFAULT_MODEL_ID, GEMMA_MODEL_ID
from kronk_llamacpp.settings import SETTINGS
from kronk_testing.agent_requests import cline, open_webui

if TYPE_CHECKING:
    from kronk_testing.server import Serve

GEMMA_TRAINED = 32768
AGENT = "agent-model"
ALIASES = ["claude-sonnet-4-6", "claude-haiku-4-5", "gpt-4o"]
# The coding agents' first requests: between these many prompt tokens.
AGENT_PROMPT = (15_000, 20_000)


def cpu(free: int) -> Device:
    return Device(0, "CPU", "CPU", "cpu", memory_free=free, memory_total=free)


def gemma_config(gemma_path: str, **settings: Any) -> ModelConfig:
    return ModelConfig.model_validate({"id": "g", "model_path": gemma_path, **settings})


# ---- the context a model gets ------------------------------------------------------------


def test_a_model_gets_its_training_length_lowered_to_what_fits(gemma_path: str) -> None:
    """The memory estimate's own arithmetic, on the real GGUF header and a CPU with this
    much free memory: the context is the largest multiple of 256 whose weights and KV cache
    take at most 90% of it; never below 2048, where the load is refused instead."""
    config = gemma_config(gemma_path, n_seq_max=4)
    meta = read_metadata(Path(gemma_path))
    weights = Path(gemma_path).stat().st_size
    _, per_token = kv_bytes_per_token(SETTINGS.of(config), meta)
    roomy = choose_context(config, [cpu(1 << 40)], meta, weights)
    assert (roomy.tokens, roomy.trained, roomy.device) == (GEMMA_TRAINED, GEMMA_TRAINED, None)
    assert roomy.describe() == "32768 tokens per slot (its training length)"

    free = int((weights + 10_000 * 4 * per_token) / 0.9) + 1
    tight = choose_context(config, [cpu(free)], meta, weights)
    assert (tight.tokens, tight.device) == (9984, "CPU")
    assert tight.describe() == (
        "9984 tokens per slot, lowered from 32768 (its training length) to fit the free "
        "memory of CPU"
    )
    fitted = estimate(config, [cpu(free)])
    assert fitted.context_window == 9984 and fitted.fits

    server_default = gemma_config(gemma_path, n_seq_max=4).with_context_default(16384)
    assert choose_context(server_default, [cpu(1 << 40)], meta, weights).describe() == (
        "16384 tokens per slot (the server's)"
    )
    assert choose_context(server_default, [cpu(free)], meta, weights).tokens == 9984

    starved = estimate(config, [cpu(weights)])
    assert starved.context_window == MIN_CONTEXT_WINDOW and not starved.fits
    with pytest.raises(InsufficientMemoryError, match="context_window 2048 x n_seq_max 4"):
        refuse_if_too_large(config, starved)


def test_the_load_logs_the_context_it_chose(
    gemma_path: str, tiny_llama_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    models = {
        "gemma": ModelConfig(model_path=Path(gemma_path), n_seq_max=1),
        "gemma-set": ModelConfig(model_path=Path(gemma_path), n_seq_max=1, context_window=4096),
        "tiny": ModelConfig(model_path=tiny_llama_path, n_seq_max=1),
    }
    caplog.set_level(logging.INFO, logger="kronk_llamacpp.backend")
    with Kronk(KronkConfig(models=models)) as kronk:
        assert kronk.load("gemma").info.n_ctx_per_seq == GEMMA_TRAINED
        assert kronk.load("gemma-set").info.n_ctx_per_seq == 4096
    assert "gemma: context_window unset: 32768 tokens per slot (its training length)" in (
        caplog.text
    )
    assert "gemma-set: context_window unset" not in caplog.text
    caplog.clear()
    # The server-wide default: a ceiling, below a model's training length only.
    with Kronk(KronkConfig(models=models, context_window=16384)) as kronk:
        assert kronk.load("gemma").info.n_ctx_per_seq == 16384
        assert kronk.load("tiny").info.n_ctx_per_seq == 256
    assert "gemma: context_window unset: 16384 tokens per slot (the server's)" in caplog.text
    assert "tiny: context_window unset: 256 tokens per slot (its training length)" in caplog.text


def test_the_packaged_models_get_their_training_length(tmp_path: Path) -> None:
    """No config file: the packaged Gemma holds a coding agent's first request (~21k
    tokens) in each of its four slots; SmolLM2 gets the 8192 it was trained on."""
    with Kronk(KronkConfig(base_path=tmp_path)) as kronk:
        gemma = kronk.load(GEMMA_MODEL_ID).info
        assert (gemma.n_ctx_per_seq, gemma.n_seq_max) == (GEMMA_TRAINED, 4)
        assert kronk.load(DEFAULT_MODEL_ID).info.n_ctx_per_seq == 8192


def test_the_server_settings_context_window_and_auto_pull_follow_the_rule() -> None:
    overrides = ServerStartCommand("start").overrides(
        {"setting__context_window": "16384"}, {"KRONK_AUTO_PULL": "true"}
    )
    settings = ServerSettings.model_validate(overrides)
    config = settings.kronk_config()
    assert (config.context_window, config.auto_pull) == (16384, True)


def test_aliases_may_not_hide_a_model_or_each_other(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"models\.a\.aliases: 'b' is a model id"):
        Kronk(KronkConfig(base_path=tmp_path, models={"a": {"aliases": ["b"]}, "b": {}}))
    with pytest.raises(ConfigError, match="'gpt-4o' is already an alias of a"):
        Kronk(
            KronkConfig(
                base_path=tmp_path,
                models={"a": {"aliases": ["gpt-4o"]}, "b": {"aliases": ["gpt-4o"]}},
            )
        )


# ---- a server as agents meet it -------------------------------------------------------------


@pytest.fixture(scope="module")
def agent_server(
    tmp_path_factory: pytest.TempPathFactory, gemma_path: str, minilm_path: Path, serve: Serve
) -> Iterator[str]:
    """Gemma with no context_window, one slot and the aliases agents send; MiniLM under the
    name OpenAI clients use for embeddings."""
    base = tmp_path_factory.mktemp("agents")
    models = base / "models.yaml"
    models.write_text(
        f"models:\n"
        f"  {AGENT}:\n"
        f"    model_path: {gemma_path}\n"
        f"    n_seq_max: 1\n"
        f"    aliases: [{', '.join(ALIASES)}]\n"
        f"  minilm:\n"
        f"    model_path: {minilm_path}\n"
        f"    aliases: [text-embedding-3-small]\n"
    )
    app = create_app(ServerSettings(base_path=base, model_config_file=models))
    with serve(app) as base_url:
        yield base_url


def cards(base_url: str) -> dict[str, dict[str, Any]]:
    return {card["id"]: card for card in httpx.get(f"{base_url}/v1/models").json()["data"]}


def cached_tokens(base_url: str) -> int:
    """The tokens the agent model's slot holds once idle (the message cache keeps them)."""
    deadline = time.monotonic() + 60
    while True:
        (entry,) = [
            entry
            for entry in httpx.get(f"{base_url}/v1/kronk/slots").json()["data"]
            if entry["model"] == AGENT
        ]
        (slot,) = entry["slots"]
        if not slot["busy"] or time.monotonic() > deadline:
            return int(slot["cached_tokens"])
        time.sleep(0.1)


def test_the_first_requests_of_coding_agents_are_served_on_a_default_context(
    agent_server: str,
) -> None:
    before = cards(agent_server)
    assert before[AGENT]["context_length"] == GEMMA_TRAINED
    assert before[AGENT]["loaded"] is False
    assert {name: before[name]["alias_of"] for name in ALIASES} == dict.fromkeys(ALIASES, AGENT)

    # Cline: OpenAI's Chat Completions, its tools described in its system prompt.
    with OpenAI(base_url=f"{agent_server}/v1", api_key="unused", max_retries=0) as client:
        stream = client.chat.completions.create(**cline(AGENT))
        chunks = iter(stream)
        assert next(chunks).model == AGENT
        assert next(chunk for chunk in chunks if chunk.choices and chunk.choices[0].delta)
        stream.close()
        assert AGENT_PROMPT[0] < cached_tokens(agent_server) < AGENT_PROMPT[1] + 8192

        # Open WebUI: the model picker lists the models, then a plain streamed chat.
        picked = [model.id for model in client.models.list()]
        assert {AGENT, *ALIASES} <= set(picked)
        stream = client.chat.completions.create(**open_webui("gpt-4o"))
        assert next(chunk for chunk in stream if chunk.choices and chunk.choices[0].delta.content)
        stream.close()

    after = cards(agent_server)
    assert after[AGENT]["loaded"] is True and after["gpt-4o"]["loaded"] is True
    assert after[AGENT]["context_length"] == after["gpt-4o"]["context_length"] == GEMMA_TRAINED


def test_aliases_answer_in_every_dialect(agent_server: str) -> None:
    with OpenAI(base_url=f"{agent_server}/v1", api_key="unused", max_retries=0) as client:
        chat = client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert chat.model == AGENT
        response = client.responses.create(model="gpt-4o", input="hi", max_output_tokens=2)
        assert response.model == AGENT
        embedded = client.embeddings.create(model="text-embedding-3-small", input="hi")
        assert embedded.model == "minilm" and len(embedded.data[0].embedding) == 384
        assert client.models.retrieve("text-embedding-3-small").model_extra == {
            "loaded": True,
            "context_length": 512,
            "input_modalities": ["text"],
            "alias_of": "minilm",
        }
    with anthropic.Anthropic(base_url=agent_server, api_key="unused", max_retries=0) as claude:
        message = claude.messages.create(
            model="claude-haiku-4-5", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
        assert message.model == AGENT
        counted = claude.messages.count_tokens(
            model="claude-haiku-4-5", messages=[{"role": "user", "content": "hi"}]
        )
        assert counted.input_tokens > 0
