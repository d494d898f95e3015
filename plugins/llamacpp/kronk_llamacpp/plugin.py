"""Hook implementations of the llamacpp plugin."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kronk_core import hookimpl
from kronk_core.backend import Backend
from kronk_core.config import ModelConfig
from kronk_core.sections import Section
from kronk_llamacpp.backend import LlamaCppBackend
from kronk_llamacpp.settings import SETTINGS


@hookimpl
def kronk_settings() -> Sequence[Section[Any]]:
    return [SETTINGS]


@hookimpl
def kronk_backend(model_config: ModelConfig) -> Backend | None:
    if model_config.backend not in (None, "llamacpp"):
        return None
    path = model_config.model_path
    if path is None or path.suffix.lower() != ".gguf":
        return None
    return LlamaCppBackend()
