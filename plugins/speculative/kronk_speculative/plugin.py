"""Hook implementations of the speculative plugin: the `draft` and `lookup` draft strategies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kronk_core import hookimpl
from kronk_core.contract import (
    ConfigError,
    DraftStrategy,
    DraftStrategyFactory,
    KronkView,
    ModelConfig,
    ModelInfo,
    Register,
    Section,
    StrategyModel,
    TextModel,
)
from kronk_speculative.draft_model import DraftModel, load_draft_model
from kronk_speculative.lookup import PromptLookup
from kronk_speculative.settings import SETTINGS, SpeculativeSettings

if TYPE_CHECKING:
    pass

# Keys that only one strategy reads: setting them for the other would be silently ignored.
_DRAFT_ONLY = ("model_id", "n_gpu_layers", "device")
_LOOKUP_ONLY = ("ngram_min", "ngram_max")


def _settings(model_config: ModelConfig, name: str, foreign: Sequence[str]) -> SpeculativeSettings:
    settings = SETTINGS.of(model_config)
    for key in foreign:
        if key in settings.model_fields_set:
            raise ConfigError(
                f"{model_config.section_key(SETTINGS.name)}.{key}",
                f"is not read by the {name!r} draft strategy this model uses (draft_strategy)",
            )
    return settings


def prompt_lookup(
    *, model_config: ModelConfig, model_info: ModelInfo, model: TextModel
) -> DraftStrategy:
    settings = _settings(model_config, "lookup", _DRAFT_ONLY)
    return PromptLookup(
        ndraft=settings.ndraft or 10,
        ngram_min=settings.ngram_min,
        ngram_max=settings.ngram_max,
        adaptive=settings.adaptive,
    )


def draft_model_factory(kronk: KronkView) -> DraftStrategyFactory:
    """The `draft` factory: it loads the draft model through `kronk`'s backends."""

    def draft_model(
        *, model_config: ModelConfig, model_info: ModelInfo, model: StrategyModel
    ) -> DraftStrategy:
        settings = _settings(model_config, "draft", _LOOKUP_ONLY)
        draft = load_draft_model(kronk, model_config, model, settings)
        return DraftModel(
            draft,
            ndraft=settings.ndraft or 5,
            n_batch=model_config.n_batch,
            adaptive=settings.adaptive,
        )

    return draft_model


@hookimpl
def kronk_settings() -> Sequence[Section[Any]]:
    return [SETTINGS]


@hookimpl
def kronk_register_draft_strategies(
    register: Register[DraftStrategyFactory], kronk: KronkView
) -> None:
    register("draft", draft_model_factory(kronk))
    # The default: free where it misses, and agents resend text their answers repeat.
    register("lookup", prompt_lookup, default=True)
