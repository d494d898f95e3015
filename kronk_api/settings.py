"""Server settings (pydantic): defaults < settings file < KRONK_* environment < flags."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kronk_core.config import (
    DEFAULT_MODEL_ID,
    Duration,
    KronkConfig,
    config_error_from,
    default_base_path,
    load_model_config_file,
)
from kronk_core.errors import ConfigError


class ServerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api_host: str = "127.0.0.1:8080"
    base_path: Path = Field(default_factory=default_base_path)
    model: str = DEFAULT_MODEL_ID
    model_config_file: Path | None = None
    preload: bool = False
    queue_wait_seconds: Annotated[float, Field(ge=0.0)] = 30.0
    models_in_cache: Annotated[int, Field(ge=1)] = 3
    cache_ttl: Duration = 20 * 60.0
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("api_host")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected HOST:PORT, got {value!r}")
        return value

    @property
    def host(self) -> str:
        return self.api_host.rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.api_host.rpartition(":")[2])

    def kronk_config(self) -> KronkConfig:
        models = load_model_config_file(self.model_config_file) if self.model_config_file else {}
        return KronkConfig(
            base_path=self.base_path.expanduser(),
            default_model=self.model,
            models=models,
            queue_wait_seconds=self.queue_wait_seconds,
            models_in_cache=self.models_in_cache,
            cache_ttl=self.cache_ttl,
        )


def load_settings(file: Path | None, overrides: dict[str, Any]) -> ServerSettings:
    """File values under explicit overrides (flags and environment)."""
    values: dict[str, Any] = {}
    if file is not None:
        try:
            loaded = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError("config", f"cannot read {file}: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError("config", f"{file} must hold a mapping of settings")
        values.update(loaded)
    values.update(overrides)
    try:
        return ServerSettings.model_validate(values)
    except ValidationError as exc:
        raise config_error_from(exc) from None
