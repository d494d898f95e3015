"""`kronk catalog update`: fetch catalog files from the configured source into <base>/catalogs.

The source is a GitHub contents-API folder listing (Kronk's catalog repository
by default: a JSON array of `{name, type, download_url}`) or the URL of one
catalog YAML file. Every file is checked before any is written, and each is
written whole (an atomic rename), so a failed update changes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import httpx

from kronk_catalog.catalog import parse_catalog, user_catalog_dir
from kronk_catalog.download import PullError
from kronk_core import __version__
from kronk_core.errors import InvalidRequestError


async def _get(client: httpx.AsyncClient, url: str) -> httpx.Response:
    try:
        response = await client.get(url)
    except httpx.HTTPError as exc:
        raise PullError(f"GET {url}: {exc}") from None
    if response.status_code >= 400:
        raise PullError(f"GET {url}: {response.status_code} {response.reason_phrase}")
    return response


def _name(url: str) -> str:
    name = PurePosixPath(urlsplit(url).path).name
    if not name.endswith((".yaml", ".yml")) or name.startswith("."):
        raise InvalidRequestError(f"{url} is not a catalog YAML file")
    return name


async def update_catalogs(source: str, base_path: Path) -> list[Path]:
    """Fetch and check every catalog of `source`, then write them; the paths written."""
    headers = {"User-Agent": f"kronk/{__version__}", "Accept": "application/vnd.github+json"}
    async with httpx.AsyncClient(follow_redirects=True, timeout=30.0, headers=headers) as client:
        listing = await _get(client, source)
        try:
            entries = listing.json()
        except ValueError:
            entries = None
        if isinstance(entries, list):
            urls = [
                str(entry["download_url"])
                for entry in entries
                if isinstance(entry, dict)
                and entry.get("type") == "file"
                and entry.get("download_url")
                and str(entry.get("name", "")).endswith((".yaml", ".yml"))
            ]
            fetched = [(url, (await _get(client, url)).text) for url in urls]
        else:
            fetched = [(source, listing.text)]
    if not fetched:
        raise PullError(f"{source} lists no catalog files")
    checked = [(_name(url), text) for url, text in fetched]
    for name, text in checked:
        parse_catalog(text, f"{source}: {name}")
    folder = user_catalog_dir(base_path)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in checked:
        target = folder / name
        temporary = target.with_name(f".{name}.partial")
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, target)
        written.append(target)
    return written
