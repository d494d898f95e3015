"""A repository's files on the Hugging Face Hub, listed through huggingface_hub; Kronk's own
downloader then fetches them (resumable, verified, with progress)."""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import HfApi, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from kronk_catalog.download import TOKEN_ADVICE, FileSpec, HubAccessError, PullError
from kronk_catalog.references import RepoReference, pick_model, pick_projector
from kronk_core.contract import ModelNotFoundError
from kronk_llamacpp.files import model_file_id

# Seconds the Hub has to list a repository.
LIST_TIMEOUT = 30.0


def repo_files(
    reference: RepoReference, models_dir: Path, endpoint: str, token: str | None
) -> tuple[str, list[FileSpec]]:
    """The model id `reference` is served under and its files: every part, then its
    projector if the repository has one, each with its size and sha256 from the Hub."""
    try:
        info = HfApi(endpoint=endpoint, token=token).model_info(
            reference.repo_id, files_metadata=True, timeout=LIST_TIMEOUT
        )
    except GatedRepoError as exc:
        raise gated_error(f"{endpoint}/{reference.repo_id}", token, exc.server_message) from None
    except (RepositoryNotFoundError, RevisionNotFoundError):
        advice = "" if token else f"; a private one needs a token: {TOKEN_ADVICE}"
        raise ModelNotFoundError(
            f"{endpoint} has no model repository {reference.repo_id}{advice}", param="model"
        ) from None
    except OfflineModeIsEnabled:
        raise PullError(f"cannot look up {reference} on the Hub: HF_HUB_OFFLINE is set") from None
    except HfHubHTTPError as exc:
        raise PullError(
            f"the Hub at {endpoint} failed listing {reference.repo_id}: {exc}"
        ) from None
    except Exception as exc:  # no connection: the HTTP library's error, which differs by version
        raise PullError(f"cannot reach the Hub at {endpoint}: {exc}") from None
    if info.gated and not token:  # the listing is public, the files are not
        raise gated_error(f"{endpoint}/{reference.repo_id}", token)
    siblings = {sibling.rfilename: sibling for sibling in info.siblings or []}
    chosen = pick_model(reference, list(siblings))
    projector = pick_projector(chosen[0], list(siblings))
    revision = info.sha or "main"
    specs = []
    for name in [*chosen, *([projector] if projector else [])]:
        sibling = siblings[name]
        specs.append(
            FileSpec(
                url=hf_hub_url(reference.repo_id, name, revision=revision, endpoint=endpoint),
                dest=models_dir / reference.repo_id / name,
                size=sibling.size,
                sha256=sibling.lfs.sha256 if sibling.lfs is not None else None,
            )
        )
    model_id = model_file_id(specs[0].dest)
    assert model_id is not None  # pick_model never picks a projector or a later part
    return model_id, specs


def gated_error(page: str, token: str | None, detail: str | None = None) -> HubAccessError:
    """What to do about a gated (or private) model the Hub would not give."""
    if token:
        return HubAccessError(
            f"the Hub refused the token for {page}: accept the model's terms there with that "
            f"account ({detail or 'access denied'})"
        )
    return HubAccessError(f"{page} is gated: accept its terms there, then {TOKEN_ADVICE}")
