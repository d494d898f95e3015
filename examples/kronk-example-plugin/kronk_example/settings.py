"""The plugin's settings: a section of the server settings and of each model's entry."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kronk_core.contract import ModelSection, ServerSection


class GreetingSettings(BaseModel):
    """`example:` in the server settings; flags `--example-*`, variables `KRONK_EXAMPLE_*`."""

    model_config = ConfigDict(extra="forbid")

    greeting: str = Field(default="hello", description="What GET /v1/example/greeting answers")


class ExtendOnlySettings(BaseModel):
    """`models.<id>.example:` for the extend-only cache strategy."""

    model_config = ConfigDict(extra="forbid")

    # A slot holding fewer tokens than this is not worth keeping for the next request.
    min_tokens: int = Field(default=16, ge=1)


SERVER = ServerSection("example", GreetingSettings)
MODEL = ModelSection("example", ExtendOnlySettings)
