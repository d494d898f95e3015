"""Configuration models (pydantic at the edge) and the YAML model-config loader.

Keys follow the Kronk user manual. Precedence for server settings is
flag > environment > file > defaults; sampling is request > model config > defaults.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Self

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from kronk_core.contract.errors import ConfigError
from kronk_core.contract.media import MediaConfig
from kronk_core.contract.selection import PluginSelection
from kronk_core.settings import spellings
from kronk_core.settings.sections import config_error_from, gather

log = logging.getLogger(__name__)

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
    typical_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    # 0: off; 1 or 2: Mirostat v1 or v2 picks the token (it replaces top-k ... and the draw).
    mirostat: Annotated[int, Field(ge=0, le=2)] | None = None
    mirostat_tau: Annotated[float, Field(ge=0.0)] | None = None
    mirostat_eta: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    min_keep: Annotated[int, Field(ge=0)] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None


class LoraAdapterConfig(BaseModel):
    """A LoRA adapter (a GGUF of llama.cpp's `convert_lora_to_gguf.py`) loaded with the model;
    `scale` is what requests get unless they ask for another (0: loaded, not applied, as
    llama-server's --lora-init-without-apply)."""

    model_config = ConfigDict(extra="forbid")

    path: Path
    scale: Annotated[float, Field(allow_inf_nan=False)] = 1.0


def _adapter_entry(value: Any) -> Any:
    """`lora: [FILE]` is short for `lora: [{path: FILE}]` (llama-server's --lora FILE)."""
    return {"path": value} if isinstance(value, str | Path) else value


class ModelConfig(BaseModel):
    """One model's settings: the `models: {ID: {...}}` entries of the model-config file.

    The core keeps what the engine and the SDK need; each plugin reads its own
    section (`sections`, see kronk_core.settings.sections), written as a key of the entry.
    """

    model_config = ConfigDict(extra="forbid")

    id: str = ""
    model_path: Path | None = None
    # Where the file comes from when model_path is unset: a reference a plugin resolves
    # (`org/repo:Q4_K_M`), pulled on first use.
    source: str | None = None
    # More names clients may send for this model: agents insist on their own (`claude-*`).
    aliases: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    # A vision or audio projector (llama.cpp's mmproj file) the model reads media through.
    projector_path: Path | None = None
    # LoRA adapters applied to every request unless it asks for other scales (`lora`).
    lora: list[Annotated[LoraAdapterConfig, BeforeValidator(_adapter_entry)]] = Field(
        default_factory=list
    )
    # A registered backend's name (`kronk_register_backends`); unset: the backend that
    # recognises the file, else the default one.
    backend: str | None = None
    # Unset: the backend chooses (llamacpp: the training length, lowered to what fits).
    context_window: Annotated[int, Field(gt=0)] | None = None
    n_batch: Annotated[int, Field(gt=0)] = 2048
    # Four slots, as llama-server's default: agents and chat UIs send concurrent requests.
    n_seq_max: Annotated[int, Field(ge=1, le=256)] = 4
    # Waiting requests per slot before new ones are refused (429): sized for agent fleets,
    # so sixteen agents on four slots all wait their turn.
    queue_depth: Annotated[int, Field(ge=1)] = 16
    # Names from the registries (kronk_register_cache_strategies / _template_processors);
    # unset: the registry's default (the built-ins make message caching the default: every
    # client worth serving resends its history).
    cache: str | None = None
    template_processor: str | None = None
    # Speculative decoding: a name from kronk_register_draft_strategies, or "none". Unset:
    # the registry's default (the built-ins: prompt lookup, free where it misses) if the
    # model can drop rejected tokens; agents resend text the answer repeats.
    draft_strategy: str | None = None
    context_overflow: ContextOverflow = ContextOverflow.error
    # llama-server's --context-shift: a generation that fills the window keeps the first
    # `n_keep` tokens (a request's), drops half of the rest from the KV cache and goes on.
    context_shift: bool = False
    # Text that ends every answer of this model as its end-of-turn token does, besides a
    # request's own `stop` (Ollama's PARAMETER stop): for a model whose turns end in text.
    stop: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    # Embedding models: trained Matryoshka-style, so a prefix of the vector is itself an
    # embedding and requests may ask for fewer `dimensions`.
    matryoshka: bool = False
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    # Plugin sections by name: raw mappings until bound, then each plugin's validated model.
    sections: dict[str, Any] = Field(default_factory=dict)
    # The server's context_window, for a model whose entry sets none (never written in a file).
    _context_default: int | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _sections_and_spellings(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        where = f"models.{data['id']}." if data.get("id") else ""
        return gather(spellings.respell_model(data, where), cls.model_fields)

    def section_key(self, name: str) -> str:
        return f"models.{self.id}.{name}" if self.id else name

    @property
    def context_default(self) -> int | None:
        """The server-wide `context_window` (KronkConfig.context_window) that a backend uses,
        at most the model's training length, when `context_window` is unset."""
        return self._context_default

    def with_context_default(self, tokens: int | None) -> ModelConfig:
        config = self.model_copy()
        config._context_default = tokens
        return config


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


def default_model_dirs() -> list[Path]:
    """KRONK_MODEL_DIRS: more folders of model files, separated by commas or os.pathsep."""
    raw = os.environ.get("KRONK_MODEL_DIRS", "")
    parts = re.split(f"[,{os.pathsep}]", raw)
    return [Path(part.strip()).expanduser() for part in parts if part.strip()]


def names_a_file(name: str) -> bool:
    """Whether a model name is a file's path (`./x.gguf`, `../x.gguf`, `/models/x.gguf`,
    `~/x.gguf`) rather than an id or a reference (`org/repo:Q4_K_M`)."""
    return name.startswith(("./", "../", "/", "~"))


class KronkConfig(BaseModel):
    """Everything an SDK or server instance needs: data paths, models, plugins."""

    model_config = ConfigDict(extra="forbid")

    base_path: Path = Field(default_factory=default_base_path)
    # Unset: the default model a backend's package ships (`Backend.packaged_models`).
    default_model: str | None = None
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    plugins: PluginSelection = Field(default_factory=PluginSelection)
    queue_wait_seconds: Annotated[float, Field(ge=0.0)] = 30.0
    # The model pool: at most this many models loaded; an idle model unloads after cache_ttl
    # seconds (0: only when the pool needs its place).
    models_in_cache: Annotated[int, Field(ge=1)] = 3
    cache_ttl: Duration = 20 * 60.0
    # The context window of a model whose entry sets none, at most its training length;
    # unset: its training length. Either way lowered to what fits in memory.
    context_window: Annotated[int, Field(gt=0)] | None = None
    # A request may name a model that is not on disk by a reference a plugin can pull
    # (`org/repo:Q4_K_M`): it is pulled first. Off, only configured references are pulled.
    auto_pull: bool = False
    # Limits on images and sounds in requests.
    media: MediaConfig = Field(default_factory=MediaConfig)
    # More folders of model files besides <base>/models, listed and served by file name
    # (never deleted by Kronk: it did not put them there).
    model_dirs: list[Path] = Field(default_factory=default_model_dirs, validate_default=True)

    @field_validator("model_dirs")
    @classmethod
    def _existing_folders(cls, value: list[Path]) -> list[Path]:
        for folder in value:
            if not folder.expanduser().is_dir():
                raise ValueError(f"{folder} is not a folder")
        return [folder.expanduser() for folder in value]

    @model_validator(mode="after")
    def _fill_ids(self) -> Self:
        for model_id, model in self.models.items():
            model.id = model_id
        return self

    @model_validator(mode="after")
    def _default_model_by_path(self) -> Self:
        """A default model named by its file (`--model ./x.gguf`, llama-server's `-m`) is
        served under the file's name, as a model-config entry of its own."""
        if self.default_model is None or not names_a_file(self.default_model):
            return self
        path = Path(self.default_model).expanduser().resolve()
        if not path.is_file():
            raise ConfigError("default_model", f"{self.default_model}: no such file")
        model_id = path.stem
        entry = self.models.get(model_id)
        if entry is None:
            self.models[model_id] = ModelConfig(id=model_id, model_path=path)
        elif entry.model_path is None or entry.model_path.expanduser().resolve() != path:
            raise ConfigError(
                "default_model",
                f"{self.default_model} would be served as {model_id!r}, which the "
                "model-config file names another file",
            )
        self.default_model = model_id
        return self

    def model(self, model_id: str) -> ModelConfig | None:
        """The configured entry for model_id, or None."""
        return self.models.get(model_id)


def alias_map(models: Mapping[str, ModelConfig]) -> dict[str, str]:
    """Each alias of the model-config entries, to its entry's id; ConfigError for an alias
    that names an entry or another entry's alias."""
    found: dict[str, str] = {}
    for model_id, model in models.items():
        for alias in model.aliases:
            if alias in models:
                raise ConfigError(f"models.{model_id}.aliases", f"{alias!r} is a model id")
            if found.get(alias, model_id) != model_id:
                raise ConfigError(
                    f"models.{model_id}.aliases", f"{alias!r} is already an alias of {found[alias]}"
                )
            found[alias] = model_id
    return found


def merge_settings(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s values, nested mappings merged key by key."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_settings(merged[key], value)
        else:
            merged[key] = value
    return merged


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
