"""The speculative plugin's section of each model's entry (`models.<id>.speculative`).

The model's core key `draft_strategy` turns speculation on and picks `draft`
or `lookup`; this section tunes it. The manual's `draft-model` block is read
as this section with `draft_strategy: draft`, and its keys (`model-id`,
`ndraft`, `ngpu-layers`, `device`) as written there.
"""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kronk_core.contract import ModelSection, Switch

# More draft tokens than this per step never pay: a miss early in a long draft wastes the rest.
MAX_NDRAFT = 32


class SpeculativeSettings(BaseModel):
    """How a model's draft strategy proposes tokens."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    # Most tokens drafted per step (default: 5 for a draft model, 10 for prompt lookup).
    ndraft: Annotated[int, Field(ge=1, le=MAX_NDRAFT)] | None = None
    # Draft only where it pays, by measured acceptance and step times; false drafts ndraft
    # tokens every step (to measure a draft model; it may then cost time).
    adaptive: bool = True
    # draft: the draft model's id (a configured or installed model with the same vocabulary).
    model_id: str | None = Field(default=None, alias="model-id", min_length=1)
    # draft: its GPU layers (0 = all, -1 = none) and device, else those of its own config.
    n_gpu_layers: int | None = Field(default=None, alias="ngpu-layers", ge=-1)
    device: Annotated[str, Field(min_length=1)] | None = None
    # lookup: the shortest and longest n-gram of recent tokens it looks for in the context.
    ngram_min: Annotated[int, Field(ge=1, le=16)] = 2
    ngram_max: Annotated[int, Field(ge=1, le=16)] = 4

    @field_validator("device", mode="before")
    @classmethod
    def _no_device(cls, value: object) -> object:
        return None if value == "" else value  # the manual writes "" for "none pinned"

    @model_validator(mode="after")
    def _ngram_range(self) -> Self:
        if self.ngram_min > self.ngram_max:
            raise ValueError(
                f"ngram_min ({self.ngram_min}) must not exceed ngram_max ({self.ngram_max})"
            )
        return self


SETTINGS = ModelSection(
    "speculative",
    SpeculativeSettings,
    other_names=("draft-model",),
    switches={"draft-model": Switch("draft_strategy", "draft")},
)
