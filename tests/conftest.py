"""Shared fixtures: one real default model per test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kronk_core import DEFAULT_MODEL_ID, Kronk, KronkConfig
from kronk_core.config import ModelConfig
from kronk_core.models import DEFAULT_MODEL_SETTINGS, default_model_path


@pytest.fixture(scope="session")
def gemma_path() -> str:
    return str(default_model_path())


@pytest.fixture(scope="session")
def kronk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kronk]:
    """The default Gemma 3 270M with 4 slots, loaded once for the session."""
    config = KronkConfig(
        base_path=tmp_path_factory.mktemp("kronk-home"),
        models={DEFAULT_MODEL_ID: ModelConfig.model_validate(DEFAULT_MODEL_SETTINGS)},
    )
    instance = Kronk(config)
    instance.load()
    yield instance
    instance.close()
