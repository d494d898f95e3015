"""The tiny GGUF generator: its model loads and decodes, and its short training length warns."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kronk_core import Kronk, KronkConfig
from kronk_core.settings.config import ModelConfig
from kronk_testing.models.tiny import N_EMBD, N_HEAD, N_HEAD_KV, N_LAYER, make_tiny_llama

# These generate their models afresh, to test the generators themselves (every other test
# takes the cached ones): tens of seconds on 2 cores, so the full tier.
pytestmark = pytest.mark.model

WARNING_TEXT = "beyond the model's training length"


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Made afresh (not the cached one), so the generator itself is tested."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-models") / "tiny-llama.gguf")


@contextmanager
def _kronk(base: Path, model: Path, context_window: int) -> Iterator[Kronk]:
    config = KronkConfig(
        base_path=base,
        models={
            "tiny": ModelConfig(
                model_path=model, templates={"template": "chatml"}, context_window=context_window
            )
        },
    )
    instance = Kronk(config)
    try:
        yield instance
    finally:
        instance.close()


async def test_tiny_llama_generates(tiny_llama: Path, tmp_path: Path) -> None:
    with _kronk(tmp_path, tiny_llama, 128) as kronk:
        result = await kronk.chat(
            [{"role": "user", "content": "hi"}], model="tiny", max_tokens=5, temperature=0
        )
        assert result.usage.completion_tokens == 5
        info = kronk.load("tiny").model.info
        assert info.n_ctx_train == 256
        # No key_length in its header (as SmolLM2's): a head is n_embd / n_head wide.
        assert info.kv_bytes_per_token == N_LAYER * N_HEAD_KV * 2 * (N_EMBD // N_HEAD) * 2


@pytest.mark.parametrize(("context_window", "warns"), [(512, True), (128, False)])
def test_context_beyond_training_length_warns(
    tiny_llama: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    context_window: int,
    warns: bool,
) -> None:
    with (
        _kronk(tmp_path, tiny_llama, context_window) as kronk,
        caplog.at_level(logging.WARNING, logger="kronk_llamacpp.model"),
    ):
        kronk.load("tiny")
    found = [
        r
        for r in caplog.records
        if r.name == "kronk_llamacpp.model"
        and r.levelno == logging.WARNING
        and WARNING_TEXT in r.getMessage()
    ]
    assert bool(found) is warns
