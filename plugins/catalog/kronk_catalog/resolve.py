"""Model names that are references (`org/repo:Q4_K_M`, `org/repo/file.gguf`, a URL): the
model pulled from there answers to them, and is pulled first when the user asked for it.

The Hub and its token are huggingface_hub's (HF_ENDPOINT; HF_TOKEN or `hf auth login`),
or the catalog section's variables (KRONK_CATALOG_HF_ENDPOINT, KRONK_CATALOG_HF_TOKEN,
KRONK_HF_TOKEN): a name is resolved wherever a model id is, with no server settings at hand.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

from kronk_catalog.download import Downloader, FileSpec
from kronk_catalog.hub import repo_files
from kronk_catalog.plans import url_files
from kronk_catalog.pulls import Pull
from kronk_catalog.references import local_model, parse_reference, without_hub_host
from kronk_catalog.settings import hub_endpoint, hub_token
from kronk_core.contract import InvalidRequestError
from kronk_llamacpp.files import model_file_id

log = logging.getLogger(__name__)

# A pull on behalf of a model name logs its progress at every tenth of the way.
PROGRESS_STEPS = 10


def resolve_model(base_path: Path, reference: str, pull: bool) -> str | None:
    """The id of the model `reference` names, pulled first if `pull` and it is not on disk;
    None when it is no reference, or is not on disk and may not be pulled."""
    endpoint = hub_endpoint(os.environ.get("KRONK_CATALOG_HF_ENDPOINT"))
    models_dir = base_path / "models"
    repo = parse_reference(reference, endpoint)
    if repo is not None:
        local = local_model(repo, models_dir)
        if local is not None:
            return model_file_id(local)
        if not pull:
            return None
        token = hub_token(os.environ.get("KRONK_CATALOG_HF_TOKEN"))
        model_id, files = repo_files(repo, models_dir, endpoint, token)
    else:
        try:
            model_id, files = url_files(
                without_hub_host(reference.strip()), None, base_path, endpoint
            )
        except InvalidRequestError:
            return None  # no reference at all: an unknown model id
        if all(spec.dest.is_file() for spec in files):
            return model_id
        if not pull:
            return None
        token = hub_token(os.environ.get("KRONK_CATALOG_HF_TOKEN"))
    asyncio.run(_pull_logged(reference, model_id, files, endpoint, token))
    return model_id


async def _pull_logged(
    reference: str, model_id: str, files: list[FileSpec], endpoint: str, token: str | None
) -> None:
    """Run the pull, logging where it is every tenth of the way; raise its error."""
    started = time.monotonic()
    pull = Pull(model=model_id, files=files, kind="reference")
    log.info("pulling %s (%s): %d files", reference, model_id, len(files))
    runner = asyncio.ensure_future(pull.run(Downloader(hf_endpoint=endpoint, hf_token=token)))
    logged = 0
    async for snapshot in pull.watch():
        step = int((snapshot["percent"] or 0) * PROGRESS_STEPS // 100)
        if step > logged and not pull.finished:
            logged = step
            log.info("pulling %s: %s%%", model_id, snapshot["percent"])
    await runner
    if pull.error is not None:
        raise pull.error
    log.info(
        "pulled %s as %s: %d bytes in %.1fs",
        reference,
        model_id,
        pull.done_bytes,
        time.monotonic() - started,
    )
