"""Other spellings of the core's keys.

The Kronk manual writes keys its own way (`context-window`, `nseq-max`,
`KRONK_WEB_API_HOST`); they stay, without a warning, so that a Kronk user's
model-config, catalog and settings files load unchanged. A plugin's keys are
spelled by its own section (`kronk_core.settings.sections.Section`), never here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kronk_core.contract.errors import ConfigError

log = logging.getLogger(__name__)

# The Kronk manual's spellings of a model entry's core keys (its model-config and catalog
# files) → ours.
MODEL_KEYS: Mapping[str, str] = {
    "context-window": "context_window",
    # Kronk's ProjFile.
    "proj-file": "projector_path",
    "proj_file": "projector_path",
    "nbatch": "n_batch",
    "nseq-max": "n_seq_max",
    "sampling-parameters": "sampling",
}
# The manual's model keys that mean nothing here: dropped with a warning that says why.
IGNORED_MODEL_KEYS: Mapping[str, str] = {
    "insecure-logging": "insecure logging is a server setting (insecure_logging)",
    "ignore-integrity-check": "pulled files are checked when downloaded, and at the server's "
    "start with its --ignore-integrity-check=false",
    "auto-fit-vram": "a model that does not fit is refused before loading (see kronk model show)",
    "cache-slot-timeout": "requests wait in the model's queue (queue_depth) for a free slot",
}

# The manual's names of server keys → ours: each also a (hidden) flag and a variable by the
# rule (`cors_allowed_origins` → `--cors-allowed-origins`, `KRONK_CORS_ALLOWED_ORIGINS`).
SERVER_KEYS: Mapping[str, str] = {
    "cors_allowed_origins": "cors_origins",
}
# Environment variables named after the manual's sections rather than by the rule → keys.
SERVER_ENVIRONMENT: Mapping[str, str] = {
    "KRONK_WEB_API_HOST": "api_host",
    "KRONK_WEB_CORS_ALLOWED_ORIGINS": "cors_origins",
    "KRONK_CATALOG_MODEL_CONFIG_FILE": "model_config_file",
    "KRONK_CACHE_MODELS_IN_CACHE": "models_in_cache",
    # The manual's HTTP timeouts: its flags are the rule's (--read-timeout), not these.
    "KRONK_WEB_READ_TIMEOUT": "read_timeout",
    "KRONK_WEB_WRITE_TIMEOUT": "write_timeout",
    "KRONK_WEB_IDLE_TIMEOUT": "idle_timeout",
    "KRONK_WEB_SHUTDOWN_TIMEOUT": "shutdown_timeout",
}


def respell_model(data: dict[str, Any], where: str = "") -> dict[str, Any]:
    """A model entry with the manual's spellings of core keys made ours; `where` prefixes
    keys in messages (`models.m1.`). Setting a key both ways is an error."""
    moved = dict(data)
    for key, why in IGNORED_MODEL_KEYS.items():
        if key in moved:
            del moved[key]
            log.warning("%s%s is ignored: %s", where, key, why)
    if moved.get("proj-file") == "":  # the manual's "no projector"
        del moved["proj-file"]
    for old, new in MODEL_KEYS.items():
        if old not in moved:
            continue
        if new in moved:
            raise ConfigError(f"{where}{old}", f"another spelling of {where}{new}; set only that")
        moved[new] = moved.pop(old)
    return moved
