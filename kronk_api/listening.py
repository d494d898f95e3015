"""One start-up summary: where the server listens (its API port, and each port or page a
plugin adds) and which models are loaded with which windows, logged once every plugin's
lifespan has started, instead of a line per service scattered through the start-up."""

from __future__ import annotations

import logging

from litestar import Litestar

from kronk_core import Kronk, LoadedModel

log = logging.getLogger("kronk_api")

# app.state key: what the plugins announced, as (what, URL) pairs.
LISTENING = "kronk_listening"


def announce(app: Litestar, what: str, url: str) -> None:
    """A plugin's lifespan says what it serves where (`"debug", "http://127.0.0.1:8090"`);
    the summary lists it after the API."""
    app.state.setdefault(LISTENING, []).append((what, url))


def api_url(app: Litestar) -> str:
    """The API's base URL as configured (`api_host`)."""
    return f"http://{app.state.settings.api_host}"


def summary(app: Litestar) -> str:
    places = [("API", api_url(app)), *app.state.get(LISTENING, [])]
    kronk: Kronk = app.state.kronk
    loaded = [
        f"{model.id} ({model.info.n_seq_max} slots of {model.info.n_ctx_per_seq} tokens)"
        if isinstance(model, LoadedModel)
        else model.id
        for model in kronk.pool.models()
    ]
    models = (
        "loaded: " + ", ".join(loaded)
        if loaded
        else f"no model loaded yet (the default, {kronk.models.default}, loads on first use)"
    )
    return "ready: " + ", ".join(f"{what} {url}" for what, url in places) + "; " + models


def log_summary(app: Litestar) -> None:
    log.info("%s", summary(app))
