"""What several commands share: the flags naming the base path, the model config file and
the server; the SDK config of the commands that work without a server; a KronkError as
click's error."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import click
from pydantic import ValidationError

from kronk_api.options import setting_option
from kronk_core import KronkConfig
from kronk_core.contract.errors import KronkError
from kronk_core.settings.config import default_base_path, load_model_config_file, names_a_file
from kronk_core.settings.sections import config_error_from

api_host_option = setting_option("api_host", help="HOST:PORT of the server [127.0.0.1:8080]")
base_path_option = setting_option(
    "base_path", type=click.Path(path_type=Path), help="Base directory for Kronk data [~/.kronk]"
)
model_config_option = setting_option(
    "model_config_file", type=click.Path(path_type=Path), help="YAML file with per-model settings"
)


def base_path_or_default(value: Path | None) -> Path:
    return (value or default_base_path()).expanduser()


def fail(error: KronkError) -> NoReturn:
    raise click.ClickException(error.message)


def local_config(
    base_path: Path | None, model_config_file: Path | None, model: str | None = None
) -> KronkConfig:
    """SDK config for commands that work without a server (model list, show, run); `model`
    a model file's path makes that file a model (`kronk run ./x.gguf`)."""
    models = load_model_config_file(model_config_file) if model_config_file else {}
    try:
        return KronkConfig(
            base_path=base_path_or_default(base_path),
            models=models,
            default_model=model if model and names_a_file(model) else None,
        )
    except ValidationError as exc:
        raise config_error_from(exc) from None
