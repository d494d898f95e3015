"""Configuration models (pydantic at the edge) and the YAML model-config loader.

Keys follow the Kronk user manual. Precedence for server settings is
flag > environment > file > defaults; sampling is request > model config > defaults.
"""

from __future__ import annotations

import logging
import os
import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Self

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kronk_core.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "gemma-3-270m-Q4_K_M"


class CacheType(StrEnum):
    """KV cache element types llama.cpp accepts for cache_type_k / cache_type_v."""

    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    q8_0 = "q8_0"
    q4_0 = "q4_0"
    q4_1 = "q4_1"
    iq4_nl = "iq4_nl"
    q5_0 = "q5_0"
    q5_1 = "q5_1"


class FlashAttention(StrEnum):
    enabled = "enabled"
    disabled = "disabled"
    auto = "auto"


class SplitMode(StrEnum):
    none = "none"
    layer = "layer"
    row = "row"


class RopeScaling(StrEnum):
    none = "none"
    linear = "linear"
    yarn = "yarn"


class ContextOverflow(StrEnum):
    error = "error"
    trim = "trim"


class SamplingConfig(BaseModel):
    """Sampling values; every field unset means "inherit" (request > model config > defaults)."""

    model_config = ConfigDict(extra="forbid")

    temperature: Annotated[float, Field(ge=0.0, le=5.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    seed: int | None = None
    repeat_penalty: Annotated[float, Field(ge=0.0)] | None = None
    repeat_last_n: Annotated[int, Field(ge=-1)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    dry_multiplier: Annotated[float, Field(ge=0.0)] | None = None
    dry_base: Annotated[float, Field(ge=1.0)] | None = None
    dry_allowed_length: Annotated[int, Field(ge=0)] | None = None
    dry_penalty_last_n: Annotated[int, Field(ge=-1)] | None = None
    xtc_probability: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    xtc_threshold: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    xtc_min_keep: Annotated[int, Field(ge=1)] | None = None
    adaptive_p_target: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    adaptive_p_decay: Annotated[float, Field(ge=0.0, lt=1.0)] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None


class ModelConfig(BaseModel):
    """One model's settings: the `models: {ID: {...}}` entries of the model-config file."""

    model_config = ConfigDict(extra="forbid")

    id: str = ""
    model_path: Path | None = None
    backend: str | None = None
    context_window: Annotated[int, Field(gt=0)] | None = None
    n_batch: Annotated[int, Field(gt=0)] = 2048
    n_ubatch: Annotated[int, Field(gt=0)] = 512
    n_seq_max: Annotated[int, Field(ge=1, le=256)] = 1
    queue_depth: Annotated[int, Field(ge=1)] = 2
    n_threads: Annotated[int, Field(ge=0)] = 0
    cache_type_k: CacheType = CacheType.f16
    cache_type_v: CacheType = CacheType.f16
    flash_attention: FlashAttention = FlashAttention.auto
    n_gpu_layers: Annotated[int, Field(ge=-1)] = 0
    offload_kqv: bool = True
    op_offload: bool = True
    split_mode: SplitMode = SplitMode.layer
    main_gpu: Annotated[int, Field(ge=0)] = 0
    # Pin the model to one device by its name (`kronk devices`: CUDA0, Vulkan1, Metal, CPU).
    device: Annotated[str, Field(min_length=1)] | None = None
    # Share of the model each GPU gets, in the order `kronk devices` lists them.
    tensor_split: Annotated[list[Annotated[float, Field(ge=0.0)]], Field(min_length=1)] | None = (
        None
    )
    swa_full: bool = True
    rope_scaling: RopeScaling = RopeScaling.none
    rope_freq_base: Annotated[float, Field(gt=0.0)] | None = None
    rope_freq_scale: Annotated[float, Field(gt=0.0)] | None = None
    yarn_ext_factor: float | None = None
    yarn_attn_factor: Annotated[float, Field(gt=0.0)] | None = None
    yarn_beta_fast: float | None = None
    yarn_beta_slow: float | None = None
    yarn_orig_ctx: Annotated[int, Field(ge=0)] | None = None
    template: str | None = None
    # Tool-call markup family (hermes, qwen3_coder, llama3, harmony, mistral, mistral_nemo,
    # gemma);
    # None: detected from the chat template and architecture.
    tool_format: str | None = None
    system_prompt_cache: bool = False
    incremental_cache: bool = False
    cache_min_tokens: Annotated[int, Field(ge=0)] = 100
    host_cache_bytes: Annotated[int, Field(ge=0)] = 1 << 30
    host_cache_dir: Path | None = None
    context_overflow: ContextOverflow = ContextOverflow.error
    # Embedding models: trained Matryoshka-style, so a prefix of the vector is itself an
    # embedding and requests may ask for fewer `dimensions`.
    matryoshka: bool = False
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)

    @field_validator("cache_type_k", "cache_type_v", mode="before")
    @classmethod
    def _lower_cache_type(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    # Field validators (not a model validator) so the error's location names the key.
    @field_validator("n_ubatch")
    @classmethod
    def _ubatch_within_batch(cls, value: int, info: ValidationInfo) -> int:
        n_batch = info.data.get("n_batch")
        if n_batch is not None and value > n_batch:
            raise ValueError(f"must be less than or equal to n_batch ({n_batch}), got {value}")
        return value

    @field_validator("tensor_split")
    @classmethod
    def _one_placement(cls, value: list[float] | None, info: ValidationInfo) -> list[float] | None:
        if value is None:
            return value
        if not any(value):
            raise ValueError("needs at least one share above 0")
        if info.data.get("device") is not None:
            raise ValueError("device pins the model to one device; set device or tensor_split")
        return value

    @field_validator("incremental_cache")
    @classmethod
    def _one_cache_mode(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("system_prompt_cache"):
            raise ValueError(
                "system_prompt_cache and incremental_cache are mutually exclusive; "
                "IMC already caches the system prompt"
            )
        return value

    @property
    def cache_strategy(self) -> str:
        """The cache-strategy name this config selects."""
        if self.incremental_cache:
            return "imc"
        if self.system_prompt_cache:
            return "spc"
        return "none"


class PluginSelection(BaseModel):
    """Which installed plugins are active. `enabled` empty means all of them."""

    model_config = ConfigDict(extra="forbid")

    enabled: list[str] = Field(default_factory=list)
    disabled: list[str] = Field(default_factory=list)


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any) -> Any:
    """Seconds from a duration as the manual writes them (`20m`, `1h30m`, `90s`) or a number."""
    if not isinstance(value, str):
        return value  # numbers (seconds) and wrong types go on to pydantic's float check
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise ValueError(f"expected a duration such as 90s, 20m or 1h30m, got {value!r}")
    return sum(float(number) * _DURATION_UNITS[unit] for number, unit in parts)


Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0.0)]


def default_base_path() -> Path:
    return Path(os.environ.get("KRONK_BASE_PATH", Path.home() / ".kronk")).expanduser()


class KronkConfig(BaseModel):
    """Everything an SDK or server instance needs: data paths, models, plugins."""

    model_config = ConfigDict(extra="forbid")

    base_path: Path = Field(default_factory=default_base_path)
    default_model: str = DEFAULT_MODEL_ID
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    plugins: PluginSelection = Field(default_factory=PluginSelection)
    queue_wait_seconds: Annotated[float, Field(ge=0.0)] = 30.0
    # The model pool: at most this many models loaded; an idle model unloads after cache_ttl
    # seconds (0: only when the pool needs its place).
    models_in_cache: Annotated[int, Field(ge=1)] = 3
    cache_ttl: Duration = 20 * 60.0

    @model_validator(mode="after")
    def _fill_ids(self) -> Self:
        for model_id, model in self.models.items():
            model.id = model_id
        return self

    def model(self, model_id: str) -> ModelConfig | None:
        """The configured entry for model_id, or None."""
        return self.models.get(model_id)


def _error_key(error: Any) -> str:
    loc = [str(part) for part in error["loc"]]
    return ".".join(loc) if loc else "config"


def config_error_from(exc: ValidationError, prefix: str = "") -> ConfigError:
    """Turn pydantic's report into a ConfigError that names the offending key."""
    first = exc.errors()[0]
    key = _error_key(first)
    if prefix:
        key = f"{prefix}.{key}" if key != "config" else prefix
    message = str(first["msg"]).removeprefix("Value error, ")
    return ConfigError(key, message)


def parse_model_config(model_id: str, data: dict[str, Any]) -> ModelConfig:
    """Validate one model's settings; errors name the key (`models.ID.key`)."""
    try:
        config = ModelConfig.model_validate({**data, "id": model_id})
    except ValidationError as exc:
        raise config_error_from(exc, f"models.{model_id}") from None
    return config


def load_model_config_file(path: Path) -> dict[str, ModelConfig]:
    """Load a model-config YAML file (`models: {ID: {...}}`)."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("model_config_file", f"file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ConfigError("model_config_file", f"{path} is not valid YAML: {exc}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not isinstance(raw.get("models", {}), dict):
        raise ConfigError("models", f"{path} must hold a mapping `models: {{ID: {{...}}}}`")
    models = raw.get("models") or {}
    unknown = sorted(set(raw) - {"models"})
    if unknown:
        raise ConfigError(unknown[0], f"unknown top-level key in {path}")
    return {
        str(model_id): parse_model_config(str(model_id), dict(settings or {}))
        for model_id, settings in models.items()
    }
