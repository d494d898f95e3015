"""`kronk catalog update`: fetch catalog files and chat templates from the configured sources.

Each source is a GitHub contents-API folder listing (Kronk's catalog
repository by default: a JSON array of `{name, type, download_url}`) or the
URL of one file. Catalogs go to <base>/catalogs, the templates they name
(`template: qwen3.jinja`) to <base>/templates. Every file is fetched and every
catalog checked before any is written, and each is written whole (an atomic
rename), so a failed update changes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import httpx

from kronk_catalog.catalog import parse_catalog, templates_dir, user_catalog_dir
from kronk_catalog.download import PullError
from kronk_core import __version__
from kronk_core.contract import InvalidRequestError

CATALOG_SUFFIXES = (".yaml", ".yml")
TEMPLATE_SUFFIXES = (".jinja",)


async def _get(client: httpx.AsyncClient, url: str) -> httpx.Response:
    try:
        response = await client.get(url)
    except httpx.HTTPError as exc:
        raise PullError(f"GET {url}: {exc}") from None
    if response.status_code >= 400:
        raise PullError(f"GET {url}: {response.status_code} {response.reason_phrase}")
    return response


def _name(url: str, suffixes: tuple[str, ...]) -> str:
    name = PurePosixPath(urlsplit(url).path).name
    if not name.endswith(suffixes) or name.startswith("."):
        raise InvalidRequestError(f"{url} is not a {' or '.join(suffixes)} file")
    return name


async def _fetch(
    client: httpx.AsyncClient, source: str, suffixes: tuple[str, ...]
) -> list[tuple[str, str]]:
    """(file name, text) of every file of `source` whose name ends in `suffixes`."""
    listing = await _get(client, source)
    try:
        entries = listing.json()
    except ValueError:
        entries = None
    if not isinstance(entries, list):
        return [(_name(source, suffixes), listing.text)]
    urls = [
        str(entry["download_url"])
        for entry in entries
        if isinstance(entry, dict)
        and entry.get("type") == "file"
        and entry.get("download_url")
        and str(entry.get("name", "")).endswith(suffixes)
    ]
    fetched = [(_name(url, suffixes), (await _get(client, url)).text) for url in urls]
    if not fetched:
        raise PullError(f"{source} lists no {' or '.join(suffixes)} files")
    return fetched


def _write(folder: Path, files: list[tuple[str, str]]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files:
        target = folder / name
        temporary = target.with_name(f".{name}.partial")
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, target)
        written.append(target)
    return written


def _client() -> httpx.AsyncClient:
    headers = {"User-Agent": f"kronk/{__version__}", "Accept": "application/vnd.github+json"}
    return httpx.AsyncClient(follow_redirects=True, timeout=30.0, headers=headers)


async def update_templates(templates_source: str, base_path: Path) -> list[Path]:
    """Fetch every chat template of `templates_source` into <base>/templates (the manual's
    `kronk catalog pull-templates`); the paths written."""
    async with _client() as client:
        templates = await _fetch(client, templates_source, TEMPLATE_SUFFIXES)
    return _write(templates_dir(base_path), templates)


async def update_catalogs(source: str, base_path: Path, templates_source: str = "") -> list[Path]:
    """Fetch and check every catalog of `source` (and every template of `templates_source`,
    if set), then write them; the paths written."""
    async with _client() as client:
        catalogs = await _fetch(client, source, CATALOG_SUFFIXES)
        templates = []
        if templates_source:
            templates = await _fetch(client, templates_source, TEMPLATE_SUFFIXES)
    for name, text in catalogs:
        parse_catalog(text, f"{source}: {name}")
    written = _write(user_catalog_dir(base_path), catalogs)
    if templates:
        written += _write(templates_dir(base_path), templates)
    return written
