"""Hook implementations of the ui plugin: the page at / and its assets under /ui/.

The assets are plain files shipped in the package (no build step); static/vendor/ holds
the Markdown renderer and sanitizer, copied from npm by scripts/vendor_ui.py. Every
answer carries a Content-Security-Policy without inline scripts or styles;
the page calls the API with the token the user enters in its settings, which
stays in the browser.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.resources import files
from importlib.resources.abc import Traversable

from litestar import Litestar, Response, Router, get
from litestar.config.app import AppConfig
from litestar.exceptions import NotFoundException
from litestar.params import FromPath

from kronk_api.contract import ENDPOINT_OPT, PUBLIC, announce, api_url
from kronk_core import hookimpl
from kronk_core.contract import KronkView
from kronk_ui.live import STATE_KEY, LiveCounts, live
from kronk_ui.reference import reference

_PUBLIC = {ENDPOINT_OPT: PUBLIC}
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
STATIC = files("kronk_ui").joinpath("static")
VENDOR = STATIC.joinpath("vendor")


def _asset(name: str, folder: Traversable = STATIC) -> Response[bytes]:
    suffix = "." + name.rpartition(".")[2]
    item = folder.joinpath(name)
    if "/" in name or name.startswith(".") or suffix not in MEDIA_TYPES or not item.is_file():
        raise NotFoundException(f"no UI asset {name!r}")
    return Response(item.read_bytes(), media_type=MEDIA_TYPES[suffix], headers=HEADERS)


@get("/", opt=_PUBLIC, include_in_schema=False)
async def index() -> Response[bytes]:
    return _asset("index.html")


@get("/ui/{name:str}", opt=_PUBLIC, include_in_schema=False)
async def asset(name: FromPath[str]) -> Response[bytes]:
    return _asset(name)


@get("/ui/vendor/{name:str}", opt=_PUBLIC, include_in_schema=False)
async def vendor_asset(name: FromPath[str]) -> Response[bytes]:
    return _asset(name, VENDOR)


@hookimpl
def kronk_app(app_config: AppConfig, kronk: KronkView) -> None:
    app_config.route_handlers.append(
        Router(path="/", route_handlers=[index, asset, vendor_asset, live, reference])
    )

    @asynccontextmanager
    async def live_counts(app: Litestar) -> AsyncIterator[None]:
        """The dashboard's live counters, fed by the hooks while the server runs."""
        counts = app.state[STATE_KEY] = LiveCounts()
        with kronk.subscribe(counts):
            announce(app, "UI", f"{api_url(app)}/")
            yield

    app_config.lifespan.append(live_counts)
