"""A decode the model refuses fails only the request whose tokens it could not take.

The real failure (llama.cpp finding no KV cell for one slot's tokens) cannot be
provoked on demand, so a test backend plugin wraps the real llamacpp model and
refuses any batch that holds a poison token, as llama_decode refuses a batch
with no room (status 1, nothing written).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from waiting import wait_idle

from kronk_core import DEFAULT_MODEL_ID, Kronk, KronkConfig, ModelConfig, hookimpl
from kronk_core.backend import Batch, TextModel
from kronk_core.errors import KronkError
from kronk_core.models import DEFAULT_MODEL_SETTINGS
from kronk_llamacpp.backend import LlamaCppBackend

POISON_WORD = " zyzzyva"


class RefusingModel:
    """The real model, except that a batch holding the poison token is refused whole."""

    def __init__(self, model: TextModel) -> None:
        self._model = model
        self.info = model.info
        self.poison = model.tokenize(POISON_WORD, add_special=False, parse_special=False)[-1]
        self.refused = 0

    def decode(self, batch: Batch) -> None:
        if self.poison in batch.tokens:
            self.refused += 1
            raise KronkError("llama_decode failed with status 1")
        self._model.decode(batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class RefusingBackend:
    name = "refusing"

    def __init__(self) -> None:
        self.models: list[RefusingModel] = []

    def load_model(self, config: ModelConfig) -> Any:
        model = RefusingModel(LlamaCppBackend().load_model(config))  # type: ignore[arg-type]
        self.models.append(model)
        return model


class RefusingPlugin:
    def __init__(self) -> None:
        self.backend = RefusingBackend()

    @hookimpl(tryfirst=True)
    def kronk_backend(self, model_config: ModelConfig) -> RefusingBackend:
        return self.backend


async def test_a_refused_decode_fails_only_its_request(tmp_path: Path, gemma_path: str) -> None:
    plugin = RefusingPlugin()
    settings = {**DEFAULT_MODEL_SETTINGS, "model_path": gemma_path, "cache": "none"}
    config = KronkConfig(
        base_path=tmp_path, models={DEFAULT_MODEL_ID: ModelConfig.model_validate(settings)}
    )
    kronk = Kronk(config, plugins={"refusing": plugin})
    try:
        loaded = kronk.load()
        healthy = ["1, 2, 3, 4, 5, 6, 7, 8,", "Monday, Tuesday, Wednesday,"]
        params: dict[str, Any] = {"max_tokens": 16, "temperature": 0}
        alone = [await kronk.chat([{"role": "user", "content": p}], **params) for p in healthy]

        async def ask(prompt: str) -> Any:
            try:
                return await kronk.chat([{"role": "user", "content": prompt}], **params)
            except KronkError as exc:
                return exc

        results = await asyncio.gather(
            ask(healthy[0]), ask(f"Say{POISON_WORD} twice."), ask(healthy[1])
        )
        assert isinstance(results[1], KronkError)
        assert "status 1" in results[1].message
        assert plugin.backend.models[0].refused >= 1
        for result, reference in zip((results[0], results[2]), alone, strict=True):
            assert result.content == reference.content
            assert result.usage.completion_tokens == reference.usage.completion_tokens
        await wait_idle(loaded.engine)  # type: ignore[union-attr]  # no slot or place leaks
        again = await kronk.chat([{"role": "user", "content": healthy[0]}], **params)
        assert again.content == alone[0].content
    finally:
        kronk.close()
