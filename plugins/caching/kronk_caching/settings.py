"""The caching plugin's section of each model's entry (`models.<id>.caching`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from kronk_core.sections import ModelSection


class CachingSettings(BaseModel):
    """How the spc and imc strategies reuse KV; the model's `cache:` key picks the strategy."""

    model_config = ConfigDict(extra="forbid")

    # Fewer shared tokens than this are not worth reusing.
    cache_min_tokens: Annotated[int, Field(ge=0)] = 100
    # IMC's host tier: RAM for the KV states of conversations evicted from slots (0: off),
    # and a directory that keeps them on disk too.
    host_cache_bytes: Annotated[int, Field(ge=0)] = 1 << 30
    host_cache_dir: Path | None = None


SETTINGS = ModelSection("caching", CachingSettings)
