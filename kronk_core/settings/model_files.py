"""Where model files are: configured paths, installed files, and models PyPI packages ship."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from kronk_core.contract.backend import BACKENDS, Backend, ModelFile, PackagedModel
from kronk_core.contract.errors import (
    ConfigError,
    InvalidRequestError,
    ModelNotFoundError,
)
from kronk_core.contract.kronk_view import KronkView
from kronk_core.settings.config import KronkConfig, ModelConfig, merge_settings, parse_model_config

log = logging.getLogger(__name__)

# Settings of the models plugins provide (`kronk_models`), by id: model-config entries.
Provided = Mapping[str, Mapping[str, Any]]


def cache_dir() -> Path:
    """The user's cache directory for Kronk (XDG_CACHE_HOME respected)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root).expanduser() / "kronk"


@dataclass(frozen=True)
class ModelSources:
    """Where models come from besides the configuration, as the plugins say: models
    installed under <base>/models by id (the first file found for an id wins), the models
    PyPI packages ship by id, and how to get a model that is not here."""

    installed: Mapping[str, ModelFile]
    packaged: Mapping[str, PackagedModel]
    hints: tuple[str, ...] = ()

    def default(self) -> PackagedModel | None:
        return next((model for model in self.packaged.values() if model.default), None)


def models_dir(config: KronkConfig) -> Path:
    return config.base_path / "models"


def find_model_files(
    root: Path, describe: Callable[[Path], ModelFile | None]
) -> dict[str, ModelFile]:
    """The models under `root` by id: every file a backend `describe`s as a model."""
    if not root.is_dir():
        return {}
    found: dict[str, ModelFile] = {}
    for path in sorted(root.rglob("*")):
        model = describe(path) if path.is_file() else None
        if model is not None:
            found.setdefault(model.id, model)
    return found


# An unknown model's message names this many of the models there are, at most.
LISTED_IN_ERRORS = 20


def unknown_model(
    model_id: str, known: Sequence[str], hints: Sequence[str] = ()
) -> ModelNotFoundError:
    """The 404 for a model id nobody serves: the ids there are, and how to get another
    (`hints`, from `kronk_pull_hint`)."""
    named = ", ".join(known[:LISTED_IN_ERRORS])
    if len(known) > LISTED_IN_ERRORS:
        named += f" and {len(known) - LISTED_IN_ERRORS} more (GET /v1/models lists them)"
    return ModelNotFoundError(
        " ".join([f"model {model_id!r} not found. Models here: {named or 'none'}.", *hints]),
        param="model",
    )


def known_model_ids(config: KronkConfig, provided: Provided, sources: ModelSources) -> list[str]:
    """Configured, provided (by plugins), installed and packaged model ids, once each.

    A file a plugin serves under its own id (a catalog model) is not listed again
    under its file name.
    """
    claimed = {str(settings.get("model_path")) for settings in provided.values()}
    installed = [
        model_id for model_id, model in sources.installed.items() if str(model.path) not in claimed
    ]
    # The default model is listed even before its package is installed: loading it says how.
    packaged = [m.id for m in sources.packaged.values() if m.default or m.installed()]
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
    provided: Provided,
    sources: ModelSources,
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
    configured = config.model(model_id)
    if source_id is not None:
        base_id = source_id
    else:
        base_id = model_id.partition("/")[0] if configured is not None else model_id
    files, packaged = sources.installed, sources.packaged
    from_plugin = provided.get(model_id, provided.get(base_id))
    if from_plugin is not None:
        base = parse_model_config(model_id, dict(from_plugin))
        if bind is not None:
            base = bind(base)
        configured = base if configured is None else _over(base, configured)
    elif configured is None:
        if model_id in packaged:
            settings = packaged[model_id].settings
            configured = ModelConfig.model_validate({"id": model_id, **settings})
        elif model_id in files:
            configured = ModelConfig(id=model_id)
        else:
            known = known_model_ids(config, provided, sources)
            raise unknown_model(model_id, known, sources.hints)
    projector = configured.projector_path
    if projector is not None:
        projector = projector.expanduser()
        if not projector.is_file():
            raise ConfigError(f"models.{model_id}.projector_path", f"file not found: {projector}")
    adapters = []
    for index, adapter in enumerate(configured.lora):
        adapter_path = adapter.path.expanduser()
        if not adapter_path.is_file():
            key = f"models.{model_id}.lora.{index}.path"
            raise ConfigError(key, f"file not found: {adapter_path}")
        adapters.append(adapter.model_copy(update={"path": adapter_path}))
    if configured.model_path is not None:
        path = configured.model_path.expanduser()
        if not path.is_file():
            raise ConfigError(f"models.{model_id}.model_path", f"file not found: {path}")
    elif base_id in files:
        path = files[base_id].path
        projector = projector or projector_beside(files[base_id])
    elif base_id in packaged:
        path = packaged[base_id].path()
    else:
        raise ConfigError(
            f"models.{model_id}.model_path",
            f"not set, and no model {base_id} under {models_dir(config)}",
        )
    return configured.model_copy(
        update={"model_path": path, "projector_path": projector, "lora": adapters}
    )


def removable_files(
    config: KronkConfig, model_id: str, provided: Provided, sources: ModelSources
) -> ModelFile:
    """What `kronk model rm` deletes: a model installed or pulled under <base>/models. Any
    other model is refused, saying where it comes from."""
    packaged = sources.packaged.get(model_id)
    if packaged is not None and config.model(model_id) is None and model_id not in provided:
        raise InvalidRequestError(
            f"{model_id} comes with a PyPI package, not from <base>/models: uninstall the "
            f"package instead (`{packaged.install}` installed it)"
        )
    path = resolve_model_config(config, model_id, provided, sources).model_path
    assert path is not None  # resolved
    root = models_dir(config)
    found = next((m for m in sources.installed.values() if m.path == path), None)
    if found is None or not path.resolve().is_relative_to(root.resolve()):
        raise InvalidRequestError(
            f"{model_id} runs from {path}, which is not under {root}: Kronk did not put it "
            "there, so it leaves it alone (remove the model's entry from the model-config "
            "file, or the file yourself)"
        )
    return found


def delete_model_files(config: KronkConfig, model: ModelFile, sources: ModelSources) -> None:
    """Delete a model's files; then its projectors if no other model lies beside them, and
    the folders under <base>/models that this empties."""
    root = models_dir(config).resolve()
    for path in model.parts:
        path.unlink(missing_ok=True)
    others = [other for other in sources.installed.values() if other.path != model.path]
    for projector in model.projectors:
        if not any(projector in other.projectors for other in others):
            projector.unlink(missing_ok=True)
    for folder in {path.parent.resolve() for path in model.parts}:
        while folder != root and folder.is_relative_to(root) and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent


def projector_beside(model: ModelFile) -> Path | None:
    """The projector pulled with an installed model: the one beside it.

    Several projectors there (one model's F16 and Q8_0, or other models') are ambiguous:
    none is taken, and `projector_path` says which.
    """
    if len(model.projectors) > 1:
        log.warning(
            "%s: %d projectors beside it (%s); set projector_path to use one",
            model.path.name,
            len(model.projectors),
            ", ".join(path.name for path in model.projectors),
        )
    return model.projectors[0] if len(model.projectors) == 1 else None


def model_file(kronk: KronkView, path: Path) -> ModelFile | None:
    """What the first backend that recognises the file at `path` says it is
    (`Backend.model_file`)."""
    return next((found for _, found in _recognised(kronk, path)), None)


def _recognised(kronk: KronkView, path: Path) -> Iterator[tuple[str, ModelFile]]:
    for name, backend in kronk.registry(BACKENDS).items():
        found = backend.model_file(path)
        if found is not None:
            yield name, found


def backend_for(kronk: KronkView, config: ModelConfig) -> tuple[str, Backend]:
    """A model's backend, by name: the one its `backend:` names; unset, the first that
    recognises its file (`Backend.model_file`), else the default one. A ConfigError
    naming the key where none is."""
    name = config.backend
    if name is None and config.model_path is not None:
        name = next((found for found, _ in _recognised(kronk, config.model_path)), None)
    registry = kronk.registry(BACKENDS)
    backend = registry.get(name, config.section_key("backend"))
    return name or registry.default or "", backend


def packaged_models(kronk: KronkView) -> dict[str, PackagedModel]:
    """The models PyPI packages ship for the backends (`Backend.packaged_models`), by id."""
    backends = kronk.registry(BACKENDS).items()
    return {model.id: model for _, backend in backends for model in backend.packaged_models()}


def model_sources(kronk: KronkView, *, installed: bool = True) -> ModelSources:
    """The models under <base>/models and the `model_dirs` the backends recognise
    (`Backend.model_file`; skipped with `installed=False`), those PyPI packages ship
    (`Backend.packaged_models`), and how to get others (`kronk_pull_hint`)."""
    found: dict[str, ModelFile] = {}
    if installed:
        describe = partial(model_file, kronk)
        # <base>/models first, then the extra folders in order: the first file of an id wins.
        for root in (models_dir(kronk.config), *kronk.config.model_dirs):
            for model_id, model in find_model_files(root, describe).items():
                found.setdefault(model_id, model)
    packaged = packaged_models(kronk)
    hints = tuple(hint for hint in kronk.hook.kronk_pull_hint() if hint)
    return ModelSources(installed=found, packaged=packaged, hints=hints)


def provided_models(kronk: KronkView) -> dict[str, Mapping[str, Any]]:
    """The models plugins provide (`kronk_models`) with their settings, by id.

    Asked anew each time: a plugin answers from what is on disk now (a catalog model pulled
    a second ago is there). The first answer for an id wins.
    """
    found: dict[str, Mapping[str, Any]] = {}
    for models in kronk.hook.kronk_models(kronk=kronk):
        for model_id, settings in (models or {}).items():
            found.setdefault(model_id, settings)
    return found


def resolve_reference(kronk: KronkView, reference: str, *, pull: bool) -> str | None:
    """The id of the model on disk a plugin finds for `reference` (kronk_resolve_model)."""
    found: str | None = kronk.hook.kronk_resolve_model(kronk=kronk, reference=reference, pull=pull)
    return found
