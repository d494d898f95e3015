"""A Hugging Face Hub on 127.0.0.1 for the tests, which cannot reach the real one: give its
`url` to `huggingface_hub` (HF_ENDPOINT) or to the catalog plugin (`hf_endpoint`).

It speaks the routes and headers the real Hub answers `huggingface_hub` and
downloaders with:

- `GET /api/models/{org}/{repo}[/revision/{rev}]` (`HfApi.model_info`; with
  `?blobs=true` every sibling has its size and, for LFS files, its sha256);
- `GET /{org}/{repo}/resolve/{rev}/{path}`: a 302 to a CDN on another port (the
  token must not follow), with X-Repo-Commit, X-Linked-Etag (the sha256),
  X-Linked-Size and ETag;
- refusals as the Hub gives them: 401 `X-Error-Code: RepoNotFound` for a missing or
  private repo without a token, 401/403 `X-Error-Code: GatedRepo` for a gated
  repo's files without a token or with one that was not granted access.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from kronk_testing.file_server import FileServer, Request, Served

_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
# Files in git rather than LFS on the real Hub: no sha256 in the listing.
_SMALL = (".md", ".json", ".gitattributes")


@dataclass
class HubRepo:
    """A model repository: its files by path, and who may read them."""

    files: dict[str, Path | bytes]
    gated: bool = False
    private: bool = False
    commit: str = field(default_factory=lambda: hashlib.sha1(b"commit").hexdigest())
    # What the CDN sends for a file instead of its bytes (a transfer gone wrong).
    sent_instead: dict[str, bytes] = field(default_factory=dict)

    def content(self, path: str) -> bytes:
        value = self.files[path]
        return value.read_bytes() if isinstance(value, Path) else value


class Hub(FileServer):
    """`with Hub(token="hf_ok") as hub:` the Hub at `hub.url`, its CDN at `hub.cdn.url`.

    `token` is the one token the Hub grants access to gated and private repos.
    """

    def __init__(self, token: str | None = None) -> None:
        super().__init__()
        self.repos: dict[str, HubRepo] = {}
        self.token = token
        self.cdn = FileServer()

    def __enter__(self) -> Hub:
        self.cdn.__enter__()
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.cdn.__exit__(*exc)

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        path, _, query = handler.path.partition("?")
        api, resolve = _API.match(path), _RESOLVE.match(path)
        if api is None and resolve is None:
            super()._answer(handler)
            return
        headers = {k.lower(): v for k, v in handler.headers.items()}
        self.requests.append(Request("GET", path, headers))
        found = api or resolve
        assert found is not None
        repo = self.repos.get(found["repo"])
        granted = self.token is not None and headers.get("authorization") == f"Bearer {self.token}"
        if repo is None or (repo.private and not granted):
            self._refuse(handler, 401, "RepoNotFound", "Repository not found")
            return
        if api is not None:
            self._json(handler, self._info(found["repo"], repo, "blobs=true" in query.lower()))
            return
        if repo.gated and not granted:
            restricted = f"Access to model {found['repo']} is restricted"
            if "authorization" in headers:
                message = f"{restricted} and you are not in the authorized list."
                self._refuse(handler, 403, "GatedRepo", message)
            else:
                message = f"{restricted}. You must be authenticated to access it. Please log in."
                self._refuse(handler, 401, "GatedRepo", message)
            return
        name = found["path"]
        if name not in repo.files or found["rev"] not in ("main", repo.commit):
            self._refuse(handler, 404, "EntryNotFound", "Entry not found")
            return
        data = repo.content(name)
        digest = hashlib.sha256(data).hexdigest()
        self.cdn.routes[f"/xet/{digest}"] = Served(data=repo.sent_instead.get(name, data))
        handler.send_response(302)
        for key, value in {
            "Location": f"http://localhost:{self.cdn.port}/xet/{digest}",
            "X-Repo-Commit": repo.commit,
            "X-Linked-Etag": f'"{digest}"',
            "X-Linked-Size": str(len(data)),
            "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
            "Content-Length": "0",
        }.items():
            handler.send_header(key, value)
        handler.end_headers()

    @staticmethod
    def _info(repo_id: str, repo: HubRepo, blobs: bool) -> dict[str, object]:
        siblings = []
        for name in sorted(repo.files):
            sibling: dict[str, object] = {"rfilename": name}
            if blobs:
                data = repo.content(name)
                sibling.update(blobId=hashlib.sha1(data).hexdigest(), size=len(data))
                if not name.endswith(_SMALL):
                    lfs = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
                    sibling["lfs"] = {**lfs, "pointerSize": 134}
            siblings.append(sibling)
        return {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0],
            "sha": repo.commit,
            "private": repo.private,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "tags": ["gguf"],
            "library_name": "gguf",
            "siblings": siblings,
        }

    @staticmethod
    def _json(handler: BaseHTTPRequestHandler, payload: object) -> None:
        body = json.dumps(payload).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    @staticmethod
    def _refuse(handler: BaseHTTPRequestHandler, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("X-Error-Code", code)
        handler.send_header("X-Error-Message", message)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
