"""Hook implementations of the Anthropic dialect plugin."""

from __future__ import annotations

from litestar.config.app import AppConfig

from kronk_anthropic.routes import router
from kronk_core import hookimpl


@hookimpl
def kronk_app(app_config: AppConfig) -> None:
    app_config.route_handlers.append(router())
