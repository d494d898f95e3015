"""The caching plugin's section of each model's entry (`models.<id>.caching`)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from kronk_core.contract import Duration, ModelSection, Switch, available_ram


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
    # IMC's host tier: RAM for the KV states of conversations evicted from slots (0: off;
    # unset: a quarter of the memory available when the model loads, at most 8 GiB, as
    # llama-server's --cache-ram), and a directory that keeps them on disk too.
    host_cache_bytes: Annotated[int, Field(ge=0)] | None = None
    host_cache_dir: Path | None = None
    # Several servers share host_cache_dir (behind a balancer): each writes every
    # conversation there after each request, not only when evicted, and restores what the
    # others wrote, so a conversation whose server died continues on another one.
    host_cache_shared: bool = False
    # host_cache_dir's bounds, per model: a conversation not written for this long goes,
    # and past this many bytes the least recently written go first (0: no bound). With
    # host_cache_shared every server applies them to all the entries there.
    host_cache_max_age: Duration = 24 * 3600.0
    host_cache_disk_bytes: Annotated[int, Field(ge=0)] = 16 << 30
    # How long the engine waits for one file-system call of the host tier (a read, a write,
    # a look at host_cache_dir); past it, the tier goes on without the disk until the call
    # returns (a hung network file system delays one request, never stops the engine).
    host_cache_disk_timeout: Annotated[Duration, Field(gt=0.0)] = 30.0
    # SPC: whose remembered system prompt a request without one gets.
    spc_system_prompt_reuse: SystemPromptReuse = SystemPromptReuse.subject


# The manual's yes/no keys for the strategy (`cache:`); `incremental_cache: false` alone is
# no caching at all.
_SPC = Switch("cache", "spc")
_IMC = Switch("cache", "imc", off="none")

SETTINGS = ModelSection(
    "caching",
    CachingSettings,
    spellings={"cache_min_tokens": "cache_min_tokens", "cache-min-tokens": "cache_min_tokens"},
    deprecated={"host_cache_bytes": "host_cache_bytes", "host_cache_dir": "host_cache_dir"},
    switches={
        "system_prompt_cache": _SPC,
        "system-prompt-cache": _SPC,
        "incremental_cache": _IMC,
        "incremental-cache": _IMC,
    },
)


HOST_CACHE_CAP = 8 << 30
HOST_CACHE_FALLBACK = 1 << 30  # where the available memory is unknown (not Linux)


def host_cache_bytes(settings: CachingSettings) -> int:
    """The host tier's RAM budget: the setting, else a quarter of what is available now."""
    if settings.host_cache_bytes is not None:
        return settings.host_cache_bytes
    available = available_ram()
    return HOST_CACHE_FALLBACK if available is None else min(available // 4, HOST_CACHE_CAP)
