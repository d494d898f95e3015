"""Hook implementations of the caching plugin: none, spc and imc."""

from __future__ import annotations

import hashlib
import json
import logging

from kronk_caching.host_store import HostStore
from kronk_caching.imc import IncrementalCache
from kronk_caching.none import NoCache
from kronk_caching.spc import SystemPromptCache
from kronk_core import hookimpl
from kronk_core.backend import ModelInfo
from kronk_core.config import ModelConfig
from kronk_core.slots import CacheStrategy

log = logging.getLogger(__name__)

# Settings that shape a sequence's KV state: a saved state is only valid under the same ones.
_KV_SHAPING = (
    "context_window",
    "n_seq_max",
    "cache_type_k",
    "cache_type_v",
    "swa_full",
    "rope_scaling",
    "rope_freq_base",
    "rope_freq_scale",
    "yarn_ext_factor",
    "yarn_attn_factor",
    "yarn_beta_fast",
    "yarn_beta_slow",
    "yarn_orig_ctx",
    "flash_attention",
)


def state_fingerprint(model_config: ModelConfig, model_info: ModelInfo) -> str:
    """Identifies model file + KV layout, so a disk entry never restores into the wrong one."""
    path = model_config.model_path
    stat = path.stat() if path is not None else None
    identity = {
        # 2: token files start with the state's trim floor.
        "format": 2,
        "file": str(path),
        "size": stat.st_size if stat else 0,
        "mtime_ns": stat.st_mtime_ns if stat else 0,
        "n_ctx_per_seq": model_info.n_ctx_per_seq,
        **model_config.model_dump(mode="json", include=set(_KV_SHAPING)),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


@hookimpl
def kronk_cache_strategy(
    name: str, model_config: ModelConfig, model_info: ModelInfo
) -> CacheStrategy | None:
    if name == "none":
        return NoCache()
    if name == "spc":
        return SystemPromptCache(min_tokens=model_config.cache_min_tokens)
    if name == "imc":
        store = None
        if model_config.host_cache_bytes or model_config.host_cache_dir:
            store = HostStore(
                max_bytes=model_config.host_cache_bytes,
                directory=model_config.host_cache_dir,
                fingerprint=state_fingerprint(model_config, model_info),
            )
        if not model_info.kv_trimmable:
            log.info(
                "%s: KV cannot be cut at any position (sliding window without swa_full, or "
                "recurrent state); IMC checkpoints each prompt's end to cut back further",
                model_info.id,
            )
        return IncrementalCache(
            min_tokens=model_config.cache_min_tokens,
            trimmable=model_info.kv_trimmable,
            store=store,
        )
    return None
