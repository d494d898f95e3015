"""The caching plugin's section of each model's entry (`models.<id>.caching`)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from kronk_core.sections import ModelSection


class SystemPromptReuse(StrEnum):
    """Whose remembered system prompt SPC gives a request that has none."""

    # The caller's own: with authentication on, the token subject's; without, everyone's.
    subject = "subject"
    # The model's, whoever sent it: one tenant behind every token.
    model = "model"
    # Never: a request without a system prompt runs without one.
    off = "off"


class CachingSettings(BaseModel):
    """How the spc and imc strategies reuse KV; the model's `cache:` key picks the strategy."""

    model_config = ConfigDict(extra="forbid")

    # Fewer shared tokens than this are not worth reusing.
    cache_min_tokens: Annotated[int, Field(ge=0)] = 100
    # IMC's host tier: RAM for the KV states of conversations evicted from slots (0: off),
    # and a directory that keeps them on disk too.
    host_cache_bytes: Annotated[int, Field(ge=0)] = 1 << 30
    host_cache_dir: Path | None = None
    # SPC: whose remembered system prompt a request without one gets.
    spc_system_prompt_reuse: SystemPromptReuse = SystemPromptReuse.subject


SETTINGS = ModelSection("caching", CachingSettings)
