"""Hook implementations of the llamacpp plugin."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from litestar.config.app import AppConfig

from kronk_core import hookimpl
from kronk_core.contract import (
    Backend,
    Device,
    MemoryEstimate,
    ModelConfig,
    ModelFacts,
    ModelFile,
    PackagedModel,
    Section,
)
from kronk_llamacpp.backend import LlamaCppBackend
from kronk_llamacpp.cli import add_commands
from kronk_llamacpp.devices import list_devices
from kronk_llamacpp.estimate import estimate
from kronk_llamacpp.facts import model_facts
from kronk_llamacpp.files import describe
from kronk_llamacpp.packaged import PACKAGED_MODELS
from kronk_llamacpp.routes import libs
from kronk_llamacpp.settings import SETTINGS


def _claims(model_config: ModelConfig) -> bool:
    if model_config.backend not in (None, "llamacpp"):
        return False
    path = model_config.model_path
    return path is not None and path.suffix.lower() == ".gguf"


@hookimpl
def kronk_settings() -> Sequence[Section[Any]]:
    return [SETTINGS]


@hookimpl
def kronk_model_file(path: Path) -> ModelFile | None:
    return describe(path)


@hookimpl
def kronk_packaged_models() -> Sequence[PackagedModel]:
    return list(PACKAGED_MODELS.values())


@hookimpl
def kronk_backend(model_config: ModelConfig) -> Backend | None:
    return LlamaCppBackend() if _claims(model_config) else None


@hookimpl
def kronk_devices() -> Sequence[Device]:
    return list_devices()


@hookimpl
def kronk_memory_estimate(model_config: ModelConfig) -> MemoryEstimate | None:
    return estimate(model_config, list_devices()) if _claims(model_config) else None


@hookimpl
def kronk_model_facts(model_config: ModelConfig) -> ModelFacts | None:
    return model_facts(model_config) if _claims(model_config) else None


@hookimpl
def kronk_app(app_config: AppConfig) -> None:
    app_config.route_handlers.append(libs)


@hookimpl
def kronk_cli(group: click.Group) -> None:
    add_commands(group)
