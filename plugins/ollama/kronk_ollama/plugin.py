"""Hook implementations of the Ollama dialect plugin."""

from __future__ import annotations

from litestar.config.app import AppConfig

from kronk_core import hookimpl
from kronk_ollama.routes import router


@hookimpl
def kronk_app(app_config: AppConfig) -> None:
    app_config.route_handlers.append(router())
