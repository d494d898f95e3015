"""Hook implementations of the OpenAI dialect plugin."""

from __future__ import annotations

from litestar.config.app import AppConfig

from kronk_core import hookimpl
from kronk_openai.routes import router


@hookimpl
def kronk_app(app_config: AppConfig) -> None:
    app_config.route_handlers.append(router())
