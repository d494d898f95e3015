"""Deprecated keys: accepted for one release with a warning, moved to where they live now.

Remove this module, and its callers, in the release after the one that moved the keys.
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

# The two booleans that chose the cache strategy → the name they chose (`cache: NAME`).
CACHE_FLAGS: Mapping[str, str] = {"system_prompt_cache": "spc", "incremental_cache": "imc"}


def warn(old: str, new: str) -> None:
    log.warning("%s is deprecated and will be removed in the next release; write %s", old, new)


def move_keys(data: dict[str, Any], table: Mapping[str, str], where: str = "") -> dict[str, Any]:
    """`data` with each deprecated key of `table` moved to its new place (`section.key`).

    `where` prefixes keys in messages (`models.m1.`). Setting both the old and
    the new key is an error: which one was meant is not ours to guess.
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
            raise ConfigError(f"{where}{old}", f"deprecated alias of {where}{new}; set only that")
        target[key] = value
        warn(f"{where}{old}", f"{where}{new}")
    return moved


def move_cache_flags(data: dict[str, Any], where: str = "") -> dict[str, Any]:
    """`system_prompt_cache: true` → `cache: spc`, `incremental_cache: true` → `cache: imc`.

    `incremental_cache: false` alone meant no caching → `cache: none`.
    """
    moved = dict(data)
    chosen = [
        name for flag, name in CACHE_FLAGS.items() if flag in moved and moved.pop(flag) is True
    ]
    if not chosen and data.get("incremental_cache") is False:
        chosen = ["none"]
    for flag, name in CACHE_FLAGS.items():
        if flag in data:
            warn(f"{where}{flag}", f"{where}cache: {chosen[0] if chosen else name}")
    if len(chosen) > 1:
        raise ConfigError(
            f"{where}incremental_cache",
            "system_prompt_cache and incremental_cache are mutually exclusive; "
            "IMC already caches the system prompt",
        )
    if chosen:
        if moved.get("cache", chosen[0]) != chosen[0]:
            raise ConfigError(f"{where}cache", f"contradicts the deprecated flag for {chosen[0]!r}")
        moved["cache"] = chosen[0]
    return moved
