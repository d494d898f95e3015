"""The example plugin's hooks: exactly those a built-in plugin uses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from litestar import Request, get
from litestar.config.app import AppConfig

from kronk_api.contract import AUTHENTICATED, ENDPOINT_OPT
from kronk_core import hookimpl
from kronk_core.contract import (
    CacheStrategy,
    CacheStrategyFactory,
    ModelConfig,
    ModelInfo,
    Register,
    Section,
)
from kronk_example.extend_only import ExtendOnly
from kronk_example.settings import MODEL, SERVER


@get("/v1/example/greeting", opt={ENDPOINT_OPT: AUTHENTICATED})
async def greeting(request: Request[Any, Any, Any]) -> dict[str, str]:
    return {"greeting": SERVER.of(request.app.state.settings).greeting}


def extend_only(*, model_config: ModelConfig, model_info: ModelInfo) -> CacheStrategy:
    return ExtendOnly(min_tokens=MODEL.of(model_config).min_tokens)


@hookimpl
def kronk_settings() -> Sequence[Section[Any]]:
    return [SERVER, MODEL]


@hookimpl
def kronk_register_cache_strategies(register: Register[CacheStrategyFactory]) -> None:
    register("extend-only", extend_only)


@hookimpl
def kronk_app(app_config: AppConfig) -> None:
    app_config.route_handlers.append(greeting)
