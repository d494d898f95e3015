"""The manual's integrity check (`kronk server start --ignore-integrity-check=false`,
`catalog.check_integrity`): every pulled catalog model's files read again at the server's
start and compared with the sha256 its catalog gives. Pulls check each file as it lands;
this finds a file changed on disk since."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from kronk_catalog.catalog import Catalog
from kronk_catalog.download import CHUNK_BYTES
from kronk_catalog.plans import models_dir
from kronk_core.contract import ConfigError

log = logging.getLogger(__name__)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while block := source.read(CHUNK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def check_pulled_models(base_path: Path, hf_endpoint: str) -> int:
    """How many files were checked; a ConfigError naming the first that differs, and the
    command that pulls it again. A model not (wholly) pulled, or a file the catalog gives
    no sha256 for, is not checked."""
    checked = 0
    for model_id, entry in Catalog(base_path).entries.items():
        specs = entry.specs(models_dir(base_path), hf_endpoint)
        if not all(spec.dest.is_file() for spec in specs):
            continue
        for spec in specs:
            if spec.sha256 is None:
                continue
            if file_sha256(spec.dest) != spec.sha256.lower():
                raise ConfigError(
                    "catalog.check_integrity",
                    f"{spec.dest} ({model_id}) does not match its catalog's sha256: "
                    f"delete it and pull it again (kronk catalog pull {model_id})",
                )
            checked += 1
    log.info("integrity: %d pulled catalog files match their sha256", checked)
    return checked
