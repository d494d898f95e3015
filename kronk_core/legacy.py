"""Other spellings of keys, moved to where they live now.

Deprecated keys are accepted for one release with a warning; remove them, and
their callers, in the release after the one that moved them. The Kronk
manual's spellings (`context-window`, `nseq-max`, ...) stay, without a
warning, so that a Kronk user's model-config and catalog files load unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kronk_core.errors import ConfigError

log = logging.getLogger(__name__)

# A model entry's old flat keys → their place in a plugin's section.
MODEL_KEYS: Mapping[str, str] = {
    **{
        key: f"llamacpp.{key}"
        for key in (
            "n_ubatch",
            "n_threads",
            "cache_type_k",
            "cache_type_v",
            "flash_attention",
            "n_gpu_layers",
            "offload_kqv",
            "op_offload",
            "split_mode",
            "main_gpu",
            "swa_full",
            "rope_scaling",
            "rope_freq_base",
            "rope_freq_scale",
            "yarn_ext_factor",
            "yarn_attn_factor",
            "yarn_beta_fast",
            "yarn_beta_slow",
            "yarn_orig_ctx",
        )
    },
    "template": "templates.template",
    "tool_format": "templates.tool_format",
    "cache_min_tokens": "caching.cache_min_tokens",
    "host_cache_bytes": "caching.host_cache_bytes",
    "host_cache_dir": "caching.host_cache_dir",
}

# The server settings' old keys (and so, by the naming rule, flags and variables) → new keys.
SERVER_KEYS: Mapping[str, str] = {
    "auth_enabled": "auth-jwt.enabled",
    "auth_issuer": "auth-jwt.issuer",
    "auth_limit_store": "auth-jwt.limit_store",
}

# Environment variables named after the manual's sections rather than by the rule → keys.
SERVER_ENVIRONMENT: Mapping[str, str] = {
    "KRONK_WEB_API_HOST": "api_host",
    "KRONK_CATALOG_MODEL_CONFIG_FILE": "model_config_file",
    "KRONK_CACHE_MODELS_IN_CACHE": "models_in_cache",
}

# The Kronk manual's model keys (its model-config and catalog files) → ours. Not deprecated.
_LLAMACPP_MANUAL_KEYS = {
    "nubatch": "n_ubatch",
    "nthreads": "n_threads",
    "cache-type-k": "cache_type_k",
    "cache-type-v": "cache_type_v",
    "flash-attention": "flash_attention",
    "ngpu-layers": "n_gpu_layers",
    "device": "device",
    "split-mode": "split_mode",
    "main-gpu": "main_gpu",
    "tensor-split": "tensor_split",
    "swa-full": "swa_full",
    "offload-kqv": "offload_kqv",
    "op-offload": "op_offload",
    "rope-scaling-type": "rope_scaling",
    "rope-freq-base": "rope_freq_base",
    "rope-freq-scale": "rope_freq_scale",
    "yarn-ext-factor": "yarn_ext_factor",
    "yarn-attn-factor": "yarn_attn_factor",
    "yarn-beta-fast": "yarn_beta_fast",
    "yarn-beta-slow": "yarn_beta_slow",
    "yarn-orig-ctx": "yarn_orig_ctx",
}
MANUAL_MODEL_KEYS: Mapping[str, str] = {
    "context-window": "context_window",
    # Kronk's ProjFile.
    "proj-file": "projector_path",
    "proj_file": "projector_path",
    "nbatch": "n_batch",
    "nseq-max": "n_seq_max",
    "sampling-parameters": "sampling",
    "cache-min-tokens": "caching.cache_min_tokens",
    # The speculative-decoding plugin's section.
    "draft-model": "speculative",
    **{old: f"llamacpp.{new}" for old, new in _LLAMACPP_MANUAL_KEYS.items()},
}
# Keys of the `draft-model` block.
MANUAL_DRAFT_KEYS: Mapping[str, str] = {"model-id": "model_id", "ngpu-layers": "n_gpu_layers"}
# The manual's model keys that mean nothing here: dropped with a warning that says why.
MANUAL_IGNORED_KEYS: Mapping[str, str] = {
    "insecure-logging": "insecure logging is a server setting (insecure_logging)",
    "ignore-integrity-check": "pulled files are checked once, when they are downloaded",
    "use-direct-io": "llama.cpp's default file reading is used",
    "nthreads-batch": "llamacpp.n_threads sets both thread counts",
    "use-mmap": "llama.cpp maps model files as it does by default",
    "numa": "NUMA placement is left to the operating system",
    "devices": "pin one device with llamacpp.device, or share among GPUs with "
    "llamacpp.tensor_split",
    "moe": "experts are placed as llama.cpp places them",
    "tensor-buft-overrides": "tensors are placed as llama.cpp places them",
    "op-offload-min-batch": "llamacpp.op_offload switches offloading on or off",
    "auto-fit-vram": "a model that does not fit is refused before loading (see kronk model show)",
    "cache-slot-timeout": "requests wait in the model's queue (queue_depth) for a free slot",
}

# The two booleans that chose the cache strategy → the name they chose (`cache: NAME`).
CACHE_FLAGS: Mapping[str, str] = {"system_prompt_cache": "spc", "incremental_cache": "imc"}
# The manual's spelling of the same booleans, which are not deprecated there.
MANUAL_CACHE_FLAGS: Mapping[str, str] = {"system-prompt-cache": "spc", "incremental-cache": "imc"}


def warn(old: str, new: str) -> None:
    log.warning("%s is deprecated and will be removed in the next release; write %s", old, new)


def move_keys(
    data: dict[str, Any], table: Mapping[str, str], where: str = "", *, deprecated: bool = True
) -> dict[str, Any]:
    """`data` with each key of `table` moved to its new place (`section.key`).

    `where` prefixes keys in messages (`models.m1.`). Setting both the old and
    the new key is an error: which one was meant is not ours to guess. A
    deprecated key is warned about; another spelling (the manual's) is not.
    """
    moved = dict(data)
    for old, new in table.items():
        if old not in moved:
            continue
        value = moved.pop(old)
        section, _, key = new.rpartition(".")
        target = moved
        if section:
            current = moved.get(section)
            if current is not None and not isinstance(current, Mapping):
                raise ConfigError(f"{where}{section}", "expected a mapping of settings")
            target = moved[section] = dict(current or {})
        if key in target:
            kind = "deprecated alias" if deprecated else "another spelling"
            raise ConfigError(f"{where}{old}", f"{kind} of {where}{new}; set only that")
        target[key] = value
        if deprecated:
            warn(f"{where}{old}", f"{where}{new}")
    return moved


def move_manual_keys(data: dict[str, Any], where: str = "") -> dict[str, Any]:
    """A model entry in the Kronk manual's spelling → ours (no warning: not deprecated)."""
    moved = dict(data)
    for key, why in MANUAL_IGNORED_KEYS.items():
        if key in moved:
            del moved[key]
            log.warning("%s%s is ignored: %s", where, key, why)
    # The manual writes `device: ""` for "no device pinned", `proj-file: ""` for no projector.
    for key in ("device", "proj-file"):
        if moved.get(key) == "":
            del moved[key]
    draft = moved.get("draft-model")
    if isinstance(draft, Mapping):
        moved["draft-model"] = move_keys(
            dict(draft), MANUAL_DRAFT_KEYS, f"{where}draft-model.", deprecated=False
        )
        # The manual's block is what turns speculation on, with its draft model.
        moved.setdefault("draft_strategy", "draft")
    moved = move_keys(moved, MANUAL_MODEL_KEYS, where, deprecated=False)
    return move_cache_flags(moved, where, MANUAL_CACHE_FLAGS, deprecated=False)


def move_cache_flags(
    data: dict[str, Any],
    where: str = "",
    flags: Mapping[str, str] = CACHE_FLAGS,
    *,
    deprecated: bool = True,
) -> dict[str, Any]:
    """`system_prompt_cache: true` → `cache: spc`, `incremental_cache: true` → `cache: imc`.

    `incremental_cache: false` alone meant no caching → `cache: none`.
    """
    moved = dict(data)
    incremental = next(flag for flag, name in flags.items() if name == "imc")
    chosen = [name for flag, name in flags.items() if flag in moved and moved.pop(flag) is True]
    if not chosen and data.get(incremental) is False:
        chosen = ["none"]
    for flag, name in flags.items():
        if flag in data and deprecated:
            warn(f"{where}{flag}", f"{where}cache: {chosen[0] if chosen else name}")
    if len(chosen) > 1:
        raise ConfigError(
            f"{where}{incremental}",
            "system_prompt_cache and incremental_cache are mutually exclusive; "
            "IMC already caches the system prompt",
        )
    if chosen:
        if moved.get("cache", chosen[0]) != chosen[0]:
            raise ConfigError(f"{where}cache", f"contradicts the deprecated flag for {chosen[0]!r}")
        moved["cache"] = chosen[0]
    return moved
