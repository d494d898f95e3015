"""Hook implementations of the catalog plugin."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import click
from litestar import Litestar
from litestar.config.app import AppConfig

from kronk_catalog.catalog import Catalog, templates_dir
from kronk_catalog.cli import add_commands
from kronk_catalog.integrity import check_pulled_models
from kronk_catalog.plans import models_dir
from kronk_catalog.pulls import Pulls
from kronk_catalog.resolve import resolve_model
from kronk_catalog.routes import STATE_KEY, router
from kronk_catalog.settings import DEFAULT_HF_ENDPOINT, SETTINGS
from kronk_core import hookimpl
from kronk_core.contract import KronkView, Section


@hookimpl
def kronk_settings() -> Sequence[Section[Any]]:
    return [SETTINGS]


@hookimpl
def kronk_models(kronk: KronkView) -> Mapping[str, Mapping[str, Any]]:
    """The pulled catalog models, with their catalog settings."""
    base = kronk.config.base_path
    root, templates = models_dir(base), templates_dir(base)
    # Where a file goes does not depend on the Hub it comes from.
    return {
        entry.id: entry.settings(root, DEFAULT_HF_ENDPOINT, templates)
        for entry in Catalog(base).list()
        if entry.pulled(root, DEFAULT_HF_ENDPOINT)
    }


@hookimpl
def kronk_pull_hint() -> str:
    return (
        "Get another with `kronk model pull REFERENCE` (org/repo:QUANT, a GGUF file's URL or "
        "HF-REPO/FILE) or `kronk catalog pull ID` (`kronk catalog list` lists them)."
    )


@hookimpl
def kronk_resolve_model(kronk: KronkView, reference: str, pull: bool) -> str | None:
    """A Hugging Face reference (`org/repo:Q4_K_M`) or a model file's URL: the model pulled
    from there, pulled now if `pull`."""
    return resolve_model(kronk.config.base_path, reference, pull)


@asynccontextmanager
async def cancel_pulls(app: Litestar) -> AsyncIterator[None]:
    """Pulls still running when the server stops are cancelled (their partial files kept
    for a resume)."""
    try:
        yield
    finally:
        pulls: Pulls | None = app.state.get(STATE_KEY)
        if pulls is not None:
            pulls.cancel()


@asynccontextmanager
async def check_integrity(app: Litestar) -> AsyncIterator[None]:
    """With `catalog.check_integrity`, the pulled models' files are checked before the
    server serves any of them."""
    settings = SETTINGS.of(app.state.settings)
    if settings.check_integrity:
        base = app.state.kronk.config.base_path
        await asyncio.to_thread(check_pulled_models, base, settings.endpoint())
    yield


@hookimpl
def kronk_app(app_config: AppConfig) -> None:
    app_config.route_handlers.append(router())
    app_config.lifespan.append(check_integrity)
    app_config.lifespan.append(cancel_pulls)


@hookimpl
def kronk_cli(group: click.Group) -> None:
    add_commands(group)
