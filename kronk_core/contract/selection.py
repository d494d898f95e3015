"""Which installed plugins are active: a config model of its own, so that the settings and
the plugin manager both read it without importing each other."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PluginSelection(BaseModel):
    """Which installed plugins are active. `enabled` empty means all of them."""

    model_config = ConfigDict(extra="forbid")

    enabled: list[str] = Field(default_factory=list)
    disabled: list[str] = Field(default_factory=list)
