"""Hook implementations of the embeddings plugin."""

from __future__ import annotations

from litestar.config.app import AppConfig

from kronk_core import hookimpl
from kronk_embeddings.routes import router


@hookimpl
def kronk_app(app_config: AppConfig) -> None:
    app_config.route_handlers.append(router())
