"""What a pull fetches: the files of a catalog model, of a Hugging Face repository named as
people name it (`org/repo:Q4_K_M`), or of a model named by URL."""

from __future__ import annotations

from pathlib import Path

from kronk_catalog.catalog import Catalog
from kronk_catalog.download import FileSpec
from kronk_catalog.hub import repo_files
from kronk_catalog.references import parse_reference, without_hub_host
from kronk_catalog.sources import remote_file, with_split_parts
from kronk_core.contract import InvalidRequestError
from kronk_llamacpp.files import model_file_id


def models_dir(base_path: Path) -> Path:
    return base_path / "models"


def catalog_files(
    catalog: Catalog, model_id: str, base_path: Path, hf_endpoint: str
) -> list[FileSpec]:
    """The files of catalog model `model_id` (ModelNotFoundError if the catalog lacks it)."""
    return catalog.get(model_id).specs(models_dir(base_path), hf_endpoint)


def url_files(
    reference: str, projector: str | None, base_path: Path, hf_endpoint: str
) -> tuple[str, list[FileSpec]]:
    """The model id a URL (or HF-REPO/FILE) is served under, and its files: every part of a
    split model, then the projector if one is named."""
    root = models_dir(base_path)
    parts = with_split_parts(remote_file(reference, hf_endpoint))
    files = [FileSpec(url=part.url, dest=root / part.relative) for part in parts]
    model_id = model_file_id(files[0].dest)
    if model_id is None:
        raise InvalidRequestError(
            f"{reference!r} names a projector, not a model: pull the model with --proj", param="url"
        )
    if projector:
        proj = remote_file(projector, hf_endpoint)
        files.append(FileSpec(url=proj.url, dest=root / proj.relative))
    return model_id, files


def reference_files(
    reference: str, projector: str | None, base_path: Path, endpoint: str, token: str | None
) -> tuple[str, list[FileSpec]]:
    """The model id and files of any reference a pull takes: a repository (asked of the Hub,
    which may take seconds) or a file (URL or HF-REPO/FILE)."""
    repo = parse_reference(reference, endpoint)
    if repo is None:
        return url_files(without_hub_host(reference.strip()), projector, base_path, endpoint)
    if projector:
        raise InvalidRequestError(
            f"{reference!r} names a repository, which brings its own projector: drop --proj",
            param="proj",
        )
    return repo_files(repo, models_dir(base_path), endpoint, token)
