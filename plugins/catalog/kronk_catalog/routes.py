"""Admin routes: the catalog, catalog updates, and pulls with their progress (SSE)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection
from pathlib import Path
from typing import Any

from litestar import Request, Response, Router, get, post
from litestar.params import FromPath, FromQuery
from litestar.response import Stream
from pydantic import BaseModel, ConfigDict, model_validator

from kronk_api.contract import ADMIN, ENDPOINT_OPT, KronkDialect, kronk_of, parse_body, sse_frame
from kronk_catalog.catalog import Catalog, CatalogEntry, templates_dir
from kronk_catalog.download import Downloader
from kronk_catalog.plans import catalog_files, models_dir, reference_files
from kronk_catalog.pulls import Pull, Pulls
from kronk_catalog.settings import SETTINGS, CatalogSettings
from kronk_catalog.update import update_catalogs, update_templates
from kronk_core.contract import InvalidRequestError, Kronk

_ADMIN = {ENDPOINT_OPT: ADMIN}
STATE_KEY = "kronk_pulls"
_DIALECT = KronkDialect()


class PullRequest(BaseModel):
    """`{"model": CATALOG_ID}`, or `{"url": REFERENCE, "proj": URL}`: a reference as
    `kronk model pull` takes it (`org/repo:Q4_K_M`, HF-REPO/FILE, a URL)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    url: str | None = None
    proj: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> PullRequest:
        if (self.model is None) == (self.url is None):
            raise ValueError("give either model (a catalog id) or url")
        if self.proj is not None and self.url is None:
            raise ValueError("proj goes with url; a catalog model names its own projector")
        return self


def _settings(request: Request[Any, Any, Any]) -> CatalogSettings:
    return SETTINGS.of(request.app.state.settings)


def _base(request: Request[Any, Any, Any]) -> Path:
    return kronk_of(request).config.base_path


def pulls_of(request: Request[Any, Any, Any]) -> Pulls:
    """The server's pulls (made on first use, on the server's event loop)."""
    pulls: Pulls | None = request.app.state.get(STATE_KEY)
    if pulls is None:
        settings = _settings(request)
        downloader = Downloader(hf_endpoint=settings.endpoint(), hf_token=settings.token())
        pulls = request.app.state[STATE_KEY] = Pulls(downloader)
    return pulls


def describe(
    entry: CatalogEntry, base_path: Path, hf_endpoint: str, packaged: Collection[str] = ()
) -> dict[str, Any]:
    """A catalog model as listed; `packaged`: the ids an installed PyPI package serves (such
    a model is served without a pull)."""
    model = entry.model
    root = models_dir(base_path)
    model_path, projector = entry.paths(root, hf_endpoint)
    template = entry.template(templates_dir(base_path))
    return {
        "id": entry.id,
        "object": "catalog.model",
        "category": model.category,
        "endpoint": model.capabilities.endpoint,
        "owned_by": model.owned_by,
        "model_family": model.model_family,
        "web_page": model.web_page,
        "gated_model": model.gated_model,
        "description": model.metadata.description,
        "capabilities": model.capabilities.model_dump(),
        "pulled": entry.pulled(root, hf_endpoint),
        "packaged": entry.id in packaged,
        "model_path": str(model_path),
        "projector_path": None if projector is None else str(projector),
        "template": model.template,
        # What it runs with: a fetched file, a bundled name, or null for the GGUF's own.
        "template_used": template,
        "files": [
            {
                "url": spec.url,
                "path": str(spec.dest),
                "size": None if file.size is None else int(file.size),
                "size_exact": spec.size is not None,
                "sha256": spec.sha256,
            }
            for file, spec in entry.files(root, hf_endpoint)
        ],
        "config": model.config,
        "catalog_file": entry.source,
    }


@get("/v1/kronk/catalog", opt=_ADMIN)
async def list_catalog(
    request: Request[Any, Any, Any], category: FromQuery[str | None] = None
) -> dict[str, Any]:
    """Every catalog model (`?category=` filters by a prefix), with whether it is pulled."""
    base, endpoint = _base(request), _settings(request).endpoint()
    catalog = Catalog(base)
    packaged = installed_packages(kronk_of(request))
    return {
        "object": "list",
        "data": [describe(entry, base, endpoint, packaged) for entry in catalog.list(category)],
        "problems": [{"file": where, "message": why} for where, why in catalog.problems],
    }


@get("/v1/kronk/catalog/{model_id:str}", opt=_ADMIN)
async def show_catalog_model(
    request: Request[Any, Any, Any], model_id: FromPath[str]
) -> dict[str, Any]:
    """One catalog entry and its files (admin)."""
    packaged = installed_packages(kronk_of(request))
    base = _base(request)
    return describe(Catalog(base).get(model_id), base, _settings(request).endpoint(), packaged)


def installed_packages(kronk: Kronk) -> set[str]:
    """The model ids installed PyPI packages serve, as the backends say
    (`Backend.packaged_models`)."""
    packaged = kronk.models.sources(installed=False).packaged.values()
    return {model.id for model in packaged if model.installed()}


@post("/v1/kronk/catalog/update", opt=_ADMIN, status_code=200)
async def update_catalog(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Fetch the catalogs of the configured source (`catalog.source`) into <base>/catalogs,
    and their templates (`catalog.templates_source`) into <base>/templates."""
    settings = _settings(request)
    written = await update_catalogs(settings.source, _base(request), settings.templates_source)
    return {"updated": [path.name for path in written]}


@post("/v1/kronk/catalog/templates/update", opt=_ADMIN, status_code=200)
async def update_catalog_templates(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Fetch the chat templates alone (`catalog.templates_source`) into <base>/templates."""
    source = _settings(request).templates_source
    if not source:
        raise InvalidRequestError("this server's catalog.templates_source is empty: no templates")
    written = await update_templates(source, _base(request))
    return {"updated": [path.name for path in written]}


@post("/v1/kronk/pulls", opt=_ADMIN, status_code=202)
async def start_pull(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Start pulling a catalog model or a reference; follow it at /v1/kronk/pulls/{id}/events."""
    body = await parse_body(request, PullRequest)
    settings = _settings(request)
    base, endpoint = _base(request), settings.endpoint()
    if body.model is not None:
        files = catalog_files(Catalog(base), body.model, base, endpoint)
        pull = pulls_of(request).start(body.model, files, kind="catalog")
    else:
        assert body.url is not None
        # A repository reference is listed by the Hub first: off the event loop.
        model_id, files = await asyncio.to_thread(
            reference_files, body.url, body.proj, base, endpoint, settings.token()
        )
        pull = pulls_of(request).start(model_id, files, kind="url")
    return pull.snapshot()


@get("/v1/kronk/pulls", opt=_ADMIN)
async def list_pulls(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The pulls this server started, with their progress (admin)."""
    return {"object": "list", "data": [pull.snapshot() for pull in pulls_of(request).list()]}


@get("/v1/kronk/pulls/{pull_id:str}", opt=_ADMIN)
async def show_pull(request: Request[Any, Any, Any], pull_id: FromPath[str]) -> dict[str, Any]:
    """One pull's progress (admin)."""
    return pulls_of(request).get(pull_id).snapshot()


async def _frames(snapshots: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    async for snapshot in snapshots:
        finished = snapshot["status"] != "running"
        yield sse_frame(snapshot, snapshot["status"] if finished else "progress")


@get("/v1/kronk/pulls/{pull_id:str}/events", opt=_ADMIN)
async def pull_events(
    request: Request[Any, Any, Any], pull_id: FromPath[str]
) -> Stream | Response[None]:
    """Server-sent events: `progress` while the pull runs, then `done` or `failed`."""
    pull: Pull = pulls_of(request).get(pull_id)
    return await _DIALECT.open_stream(request, pull.watch(), _frames)


def router() -> Router:
    return Router(
        path="/",
        route_handlers=[
            list_catalog,
            show_catalog_model,
            update_catalog,
            update_catalog_templates,
            start_pull,
            list_pulls,
            show_pull,
            pull_events,
        ],
    )
