"""Hook implementations of the caching plugin: the none, spc and imc strategies."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from kronk_caching.host_store import HostStore
from kronk_caching.imc import IncrementalCache
from kronk_caching.none import NoCache
from kronk_caching.settings import SETTINGS, host_cache_bytes
from kronk_caching.spc import SystemPromptCache
from kronk_core import hookimpl
from kronk_core.contract import (
    CacheStrategy,
    CacheStrategyFactory,
    ModelConfig,
    ModelInfo,
    Register,
    Section,
)

log = logging.getLogger(__name__)


def state_fingerprint(model_config: ModelConfig, model_info: ModelInfo) -> str:
    """Identifies model file + KV layout, so a disk entry never restores into the wrong one.

    The layout is the core keys that shape a sequence's KV plus every other
    plugin's settings of the model (the backend's among them): a change of an
    unrelated setting then drops entries needlessly, but never restores a wrong one.
    """
    path = model_config.model_path
    stat = path.stat() if path is not None else None
    sections = {
        name: section.model_dump(mode="json") if isinstance(section, BaseModel) else section
        for name, section in model_config.sections.items()
        if name != SETTINGS.name
    }
    identity = {
        # 2: token files start with the state's trim floor.
        "format": 2,
        "file": str(path),
        "size": stat.st_size if stat else 0,
        "mtime_ns": stat.st_mtime_ns if stat else 0,
        "n_ctx_per_seq": model_info.n_ctx_per_seq,
        **model_config.model_dump(mode="json", include={"context_window", "n_seq_max"}),
        "sections": sections,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


def no_cache(*, model_config: ModelConfig, model_info: ModelInfo) -> CacheStrategy:
    return NoCache()


def system_prompt_cache(*, model_config: ModelConfig, model_info: ModelInfo) -> CacheStrategy:
    settings = SETTINGS.of(model_config)
    return SystemPromptCache(
        min_tokens=settings.cache_min_tokens, reuse=settings.spc_system_prompt_reuse
    )


def incremental_cache(*, model_config: ModelConfig, model_info: ModelInfo) -> CacheStrategy:
    settings = SETTINGS.of(model_config)
    store = None
    budget = host_cache_bytes(settings)
    if budget or settings.host_cache_dir:
        log.info("%s: host cache tier of %.1f GiB", model_info.id, budget / (1 << 30))
        store = HostStore(
            max_bytes=budget,
            directory=settings.host_cache_dir,
            fingerprint=state_fingerprint(model_config, model_info),
            shared=settings.host_cache_shared and settings.host_cache_dir is not None,
            disk_max_bytes=settings.host_cache_disk_bytes,
            disk_max_age=settings.host_cache_max_age,
            # A valid entry holds at most a slot's context (the fingerprint includes it),
            # and no file of it comes near twice the model's memory, weights and all KV
            # (0: unknown, no bound).
            max_tokens=model_info.n_ctx_per_seq,
            max_file_bytes=2 * model_info.memory_bytes or None,
            disk_timeout=settings.host_cache_disk_timeout,
        )
    if not model_info.kv_trimmable:
        log.info(
            "%s: KV cannot be cut at any position (sliding window without swa_full, or "
            "recurrent state); IMC checkpoints each prompt's end to cut back further",
            model_info.id,
        )
    return IncrementalCache(
        min_tokens=settings.cache_min_tokens,
        trimmable=model_info.kv_trimmable,
        store=store,
        write_through=store is not None and settings.host_cache_shared,
        recurrent=model_info.recurrent,
    )


@hookimpl
def kronk_settings() -> Sequence[Section[Any]]:
    return [SETTINGS]


@hookimpl
def kronk_register_cache_strategies(register: Register[CacheStrategyFactory]) -> None:
    register("none", no_cache)
    register("spc", system_prompt_cache)
    # Message caching is the default: every client worth serving resends its history.
    register("imc", incremental_cache, default=True)
