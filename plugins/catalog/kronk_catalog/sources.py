"""Where a model file comes from and where it goes: URLs, `HF-REPO/FILE` names, split parts.

A Hugging Face file (`owner/repo/path/file.gguf`, or a Hub URL
`https://HOST/owner/repo/resolve/REV/path`) is stored at
`<base>/models/owner/repo/path/file.gguf`; any other URL at
`<base>/models/<host>/<file>`. Where a file goes never depends on which Hub
serves it. A split model (`name-00001-of-00003.gguf`) is
all of its parts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import quote, unquote, urlsplit

from kronk_core.contract import InvalidRequestError

SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$", re.I)
# https://HUB/owner/repo/resolve/REVISION/path (or /blob/, the page people copy).
_HUB_PATH = re.compile(
    r"^/(?P<owner>[^/]+)/(?P<repo>[^/]+)/(?:resolve|blob)/(?P<rev>[^/]+)/(?P<path>.+)$"
)


@dataclass(frozen=True)
class RemoteFile:
    """One file to download: its URL and its place under `<base>/models`."""

    url: str
    relative: PurePosixPath


def _safe(parts: list[str], reference: str) -> PurePosixPath:
    if not parts or any(part in ("", ".", "..") or "\\" in part for part in parts):
        raise InvalidRequestError(f"{reference!r} does not name a file", param="url")
    return PurePosixPath(*parts)


def _require_gguf(relative: PurePosixPath, reference: str) -> None:
    if relative.suffix.lower() != ".gguf":
        raise InvalidRequestError(
            f"{reference!r} is not a GGUF file (expected a name ending in .gguf)", param="url"
        )


def remote_file(reference: str, hf_endpoint: str) -> RemoteFile:
    """The download of `reference`: an http(s) URL or a Hugging Face `owner/repo/file.gguf`."""
    reference = reference.strip()
    hub = hf_endpoint.rstrip("/")
    if reference.startswith(("http://", "https://")):
        url = urlsplit(reference)
        found = _HUB_PATH.match(unquote(url.path))
        if found:  # a Hub's file URL, on whichever host: stored as owner/repo/path
            path = found["path"].split("/")
            relative = _safe([found["owner"], found["repo"], *path], reference)
            head = f"{url.scheme}://{url.netloc}/{found['owner']}/{found['repo']}"
            download = f"{head}/resolve/{found['rev']}/{quote('/'.join(path))}"
        else:
            if not url.hostname:
                raise InvalidRequestError(f"{reference!r} has no host", param="url")
            name = PurePosixPath(unquote(url.path)).name
            relative = _safe([url.hostname, name], reference)
            download = reference
        _require_gguf(relative, reference)
        return RemoteFile(download, relative)
    parts = reference.split("/")
    if len(parts) < 3 or ":" in parts[0]:
        raise InvalidRequestError(
            f"{reference!r} is neither a URL (https://...) nor HF-REPO/FILE (owner/repo/file.gguf)",
            param="url",
        )
    relative = _safe(parts, reference)
    _require_gguf(relative, reference)
    download = f"{hub}/{parts[0]}/{parts[1]}/resolve/main/{quote('/'.join(parts[2:]))}"
    return RemoteFile(download, relative)


def with_split_parts(file: RemoteFile) -> list[RemoteFile]:
    """Every part of a split model, when `file` is one of them; else just `file`."""
    found = SPLIT_NAME.match(file.relative.name)
    if found is None:
        return [file]
    count = int(found["count"])
    own = f"-{found['part']}-of-{found['count']}"
    parts = []
    for number in range(1, count + 1):
        other = f"-{number:05d}-of-{found['count']}"
        name = file.relative.name.replace(own, other)
        url_head, _, url_name = file.url.rpartition("/")
        parts.append(
            RemoteFile(f"{url_head}/{url_name.replace(own, other)}", file.relative.with_name(name))
        )
    return parts
