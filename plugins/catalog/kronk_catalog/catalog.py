"""Catalogs in Kronk's format: the bundled one and the user's `<base>/catalogs/*.yaml`.

    catalog: Text-Generation
    models:
      - id: Qwen3-8B-Q8_0
        category: Text-Generation
        files:
          models:
            - url: Qwen/Qwen3-8B-GGUF/Qwen3-8B-Q8_0.gguf   # HF-REPO/FILE or a URL
              size: 8.71 GB                               # bytes, or as Kronk writes it
              sha256: 0123...                             # checked before the file is used
          proj: {url: ..., size: ..., sha256: ...}         # a vision/audio projector
        template: qwen3.jinja                             # in <base>/templates, if fetched
        capabilities: {endpoint: chat_completion, ...}
        config: {context-window: 32768, nseq-max: 2, ...} # its model-config entry

A user's catalog may name a model the bundled one has: the user's entry wins.
Keys of a model this format does not know are ignored, as Kronk ignores them,
so that catalogs written for a newer Kronk still load.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from kronk_catalog.download import FileSpec
from kronk_catalog.sources import RemoteFile, remote_file
from kronk_core.contract import (
    ConfigError,
    ModelNotFoundError,
    config_error_from,
    parse_model_config,
)

log = logging.getLogger(__name__)

BUNDLED = "bundled"


class CatalogFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str
    # Bytes, or as Kronk writes it ("8.71 GB", rounded: shown, never checked).
    size: ByteSize | None = None
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")
    _exact: bool = PrivateAttr(default=False)

    @model_validator(mode="wrap")
    @classmethod
    def _remember_exact(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        file = handler(data)
        size = data.get("size") if isinstance(data, dict) else None
        file._exact = isinstance(size, int) and not isinstance(size, bool)
        return file

    @property
    def exact_size(self) -> int | None:
        """The size in bytes when the catalog gives it exactly (a download must match it)."""
        return int(self.size) if self.size is not None and self._exact else None

    @field_validator("sha256", mode="before")
    @classmethod
    def _digits_only(cls, value: Any) -> Any:
        # Unquoted in YAML, a digest of digits alone reads as a number.
        return f"{value:064d}" if isinstance(value, int) and not isinstance(value, bool) else value


class CatalogFiles(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: list[CatalogFile] = Field(min_length=1)
    proj: CatalogFile | None = None

    @field_validator("proj", mode="before")
    @classmethod
    def _empty_proj(cls, value: Any) -> Any:
        # Kronk's files write `proj: {}` (or leave its url empty) for "none".
        return None if not value or (isinstance(value, dict) and not value.get("url")) else value


class Capabilities(BaseModel):
    model_config = ConfigDict(extra="allow")

    endpoint: str = "chat_completion"
    images: bool = False
    audio: bool = False
    video: bool = False
    streaming: bool = True
    reasoning: bool = False
    tooling: bool = False
    embedding: bool = False
    rerank: bool = False


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow")

    created: str | None = None
    collections: str | None = None
    description: str = ""

    @field_validator("created", mode="before")
    @classmethod
    def _as_text(cls, value: Any) -> Any:
        return None if value is None else str(value)


class CatalogModel(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str = Field(min_length=1)
    category: str
    owned_by: str = ""
    model_family: str = ""
    architecture: str = ""
    gguf_arch: str = ""
    parameters: str = ""
    web_page: str = ""
    gated_model: bool = False
    testing_model: bool = False
    # A chat template of Kronk's templates (`kronk catalog update` fetches them into
    # <base>/templates), or a bundled template's name.
    template: str | None = None
    files: CatalogFiles
    capabilities: Capabilities = Field(default_factory=Capabilities)
    metadata: Metadata = Field(default_factory=Metadata)
    config: dict[str, Any] = Field(default_factory=dict)

    @field_validator("config", mode="before")
    @classmethod
    def _no_config(cls, value: Any) -> Any:
        return value or {}


class CatalogDocument(BaseModel):
    model_config = ConfigDict(extra="ignore")

    catalog: str
    models: list[CatalogModel] = Field(default_factory=list)


@dataclass(frozen=True)
class CatalogEntry:
    """A catalog model, where it was read from, and where its files go."""

    model: CatalogModel
    source: str

    @property
    def id(self) -> str:
        return self.model.id

    def remote(self, hf_endpoint: str) -> tuple[list[RemoteFile], RemoteFile | None]:
        models = [remote_file(file.url, hf_endpoint) for file in self.model.files.models]
        proj = self.model.files.proj
        return models, remote_file(proj.url, hf_endpoint) if proj is not None else None

    def files(self, models_dir: Path, hf_endpoint: str) -> list[tuple[CatalogFile, FileSpec]]:
        """Each file as the catalog lists it and as it is pulled: model parts first, the
        projector last."""
        listed = [*self.model.files.models]
        if self.model.files.proj is not None:
            listed.append(self.model.files.proj)
        return [
            (
                file,
                FileSpec(
                    url=remote.url,
                    dest=models_dir / remote.relative,
                    size=file.exact_size,
                    sha256=file.sha256.lower() if file.sha256 else None,
                ),
            )
            for file in listed
            for remote in [remote_file(file.url, hf_endpoint)]
        ]

    def specs(self, models_dir: Path, hf_endpoint: str) -> list[FileSpec]:
        """The files to pull, model parts first, the projector last."""
        return [spec for _, spec in self.files(models_dir, hf_endpoint)]

    def paths(self, models_dir: Path, hf_endpoint: str) -> tuple[Path, Path | None]:
        """The model's first file (what llama.cpp loads) and its projector, if any."""
        models, proj = self.remote(hf_endpoint)
        return models_dir / models[0].relative, models_dir / proj.relative if proj else None

    def pulled(self, models_dir: Path, hf_endpoint: str) -> bool:
        return all(spec.dest.is_file() for spec in self.specs(models_dir, hf_endpoint))

    def template(self, templates: Path) -> str | None:
        """The chat template it runs with: its file in `templates` (<base>/templates), a
        bundled template's name, or None (the GGUF's own: the file was not fetched)."""
        name = self.model.template
        if not name:
            return None
        fetched = templates / name
        if fetched.is_file():
            return str(fetched)
        return None if name.endswith(".jinja") else name

    def settings(self, models_dir: Path, hf_endpoint: str, templates: Path) -> dict[str, Any]:
        """Its model-config entry: the catalog's settings, the template, the file and its
        projector."""
        settings = dict(self.model.config)
        template = self.template(templates)
        if template is not None:
            section = dict(settings.get("templates") or {})
            section.setdefault("template", template)
            settings["templates"] = section
        model_path, projector = self.paths(models_dir, hf_endpoint)
        settings["model_path"] = str(model_path)
        if projector is not None:
            settings.setdefault("projector_path", str(projector))
        return settings


def parse_catalog(text: str, where: str) -> list[CatalogModel]:
    """The models of one catalog file; errors name the file and the key."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(where, f"not valid YAML: {exc}") from None
    try:
        document = CatalogDocument.model_validate(raw)
    except ValidationError as exc:
        error = config_error_from(exc)
        raise ConfigError(f"{where}: {error.key}", error.message.partition(": ")[2]) from None
    for model in document.models:
        # Its settings must load as a model-config entry (the manual's spellings included).
        try:
            parse_model_config(model.id, model.config)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc.key}", exc.message.partition(": ")[2]) from None
    return document.models


def bundled_catalog_files() -> list[tuple[str, str]]:
    folder = files("kronk_catalog").joinpath("catalogs")
    return sorted(
        (f"{BUNDLED}/{item.name}", item.read_text(encoding="utf-8"))
        for item in folder.iterdir()
        if item.name.endswith(".yaml")
    )


def user_catalog_dir(base_path: Path) -> Path:
    return base_path / "catalogs"


def templates_dir(base_path: Path) -> Path:
    """Where `kronk catalog update` puts the chat templates catalog entries name."""
    return base_path / "templates"


class Catalog:
    """Every catalog model by id: the bundled catalog under the user's catalogs."""

    def __init__(self, base_path: Path) -> None:
        self.base_path = base_path
        self.entries: dict[str, CatalogEntry] = {}
        # Catalog files that could not be read: (file, why). They are skipped, not fatal.
        self.problems: list[tuple[str, str]] = []
        sources = bundled_catalog_files()
        folder = user_catalog_dir(base_path)
        if folder.is_dir():
            sources += [
                (str(path), path.read_text(encoding="utf-8"))
                for path in sorted(folder.glob("*.y*ml"))
            ]
        for where, text in sources:
            try:
                models = parse_catalog(text, where)
            except ConfigError as exc:
                why = exc.message.removeprefix(f"{where}: ")
                log.error("catalog %s skipped: %s", where, why)
                self.problems.append((where, why))
                continue
            for model in models:
                self.entries[model.id] = CatalogEntry(model, where)

    def get(self, model_id: str) -> CatalogEntry:
        entry = self.entries.get(model_id)
        if entry is None:
            raise ModelNotFoundError(
                f"model {model_id!r} is not in the catalog (see `kronk catalog list`; "
                "`kronk catalog update` fetches the latest catalogs)",
                param="model",
            )
        return entry

    def list(self, category: str | None = None) -> list[CatalogEntry]:
        """Entries by category then id; `category` filters by a case-insensitive prefix."""
        chosen = [
            entry
            for entry in self.entries.values()
            if category is None or entry.model.category.lower().startswith(category.lower())
        ]
        return sorted(chosen, key=lambda entry: (entry.model.category, entry.id))
