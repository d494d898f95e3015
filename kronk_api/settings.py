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
    insecure_logging: bool = False
    cors_origins: list[str] = Field(default_factory=list)
    max_request_bytes: Annotated[int, Field(ge=1024)] = 32 << 20
    json_max_depth: Annotated[int, Field(ge=2)] = 64
    json_max_string_length: Annotated[int, Field(ge=1)] = 24 << 20
    json_max_items: Annotated[int, Field(ge=1)] = 100_000
    auth_enabled: bool = False
    auth_issuer: str = "kronk"
    auth_limit_store: str = "sqlite"

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: Any) -> Any:
        # Flags and environment variables give one comma-separated string.
        if isinstance(value, str):
            return [origin.strip() for origin in value.split(",") if origin.strip()]
        return value

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
