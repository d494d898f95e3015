"""Hook implementations of the caching plugin."""

from __future__ import annotations

from kronk_caching.none import NoCache
from kronk_core import hookimpl
from kronk_core.config import ModelConfig
from kronk_core.slots import CacheStrategy


@hookimpl
def kronk_cache_strategy(name: str, model_config: ModelConfig) -> CacheStrategy | None:
    if name == "none":
        return NoCache()
    return None
