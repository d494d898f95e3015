"""A local HTTP file server for download tests: Range and If-Range, redirects, and the
failures a real one has (a connection dropped halfway, a stall until told to go on, 404).

It stands in for Hugging Face and other hosts, which tests cannot reach: `with FileServer()
as server:`, then `server.routes["/a/model.gguf"] = Served(path=...)`; `server.requests`
records what was asked. The standard library only.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CHUNK = 1 << 20


@dataclass
class Served:
    """One path's answer."""

    path: Path | None = None
    data: bytes = b""
    # Send this many bytes of the first whole-file answer, then drop the connection.
    drop_after: int | None = None
    # Send this many bytes, then wait for `go` before the rest (a slow server, on cue).
    pause_after: int | None = None
    go: threading.Event = field(default_factory=threading.Event)
    paused: threading.Event = field(default_factory=threading.Event)
    # Claim this Content-Length (a file too big for the disk); nothing is sent.
    claimed_size: int | None = None
    redirect: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    ranges: bool = True

    def size(self) -> int:
        return self.path.stat().st_size if self.path is not None else len(self.data)

    def read(self, start: int, end: int) -> Iterator[bytes]:
        if self.path is None:
            yield self.data[start:end]
            return
        with self.path.open("rb") as source:
            source.seek(start)
            left = end - start
            while left > 0:
                block = source.read(min(CHUNK, left))
                if not block:
                    return
                left -= len(block)
                yield block

    def etag(self) -> str:
        digest = hashlib.sha256(self.path.read_bytes() if self.path else self.data)
        return f'"{digest.hexdigest()[:32]}"'


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]


class FileServer:
    """`with FileServer() as server:` serves `server.routes` on 127.0.0.1."""

    def __init__(self) -> None:
        self.routes: dict[str, Served] = {}
        self.requests: list[Request] = []
        self._etags: dict[str, str] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: object) -> None:
                pass

            def do_GET(self) -> None:
                outer._answer(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FileServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        for served in self.routes.values():
            served.go.set()
        self._server.shutdown()
        self._server.server_close()

    def gets(self, path: str) -> list[Request]:
        return [request for request in self.requests if request.path == path]

    def _etag(self, path: str, served: Served) -> str:
        if path not in self._etags:
            self._etags[path] = served.etag()
        return self._etags[path]

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        path = handler.path.split("?")[0]
        self.requests.append(
            Request("GET", path, {k.lower(): v for k, v in handler.headers.items()})
        )
        served = self.routes.get(path)
        if served is None:
            body = b"not found"
            handler.send_response(404)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
            return
        if served.redirect is not None:
            handler.send_response(302)
            handler.send_header("Location", served.redirect)
            for name, value in served.headers.items():
                handler.send_header(name, value)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        if served.claimed_size is not None:
            handler.send_response(200)
            handler.send_header("Content-Length", str(served.claimed_size))
            handler.end_headers()
            handler.close_connection = True
            return
        size, etag = served.size(), self._etag(path, served)
        start, end, status = 0, size, 200
        wanted = re.match(r"bytes=(\d+)-$", handler.headers.get("Range", ""))
        if_range = handler.headers.get("If-Range")
        if served.ranges and wanted and (if_range is None or if_range == etag):
            start, status = int(wanted.group(1)), 206
            if start >= size:
                handler.send_response(416)
                handler.send_header("Content-Range", f"bytes */{size}")
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
        handler.send_response(status)
        handler.send_header("Content-Length", str(end - start))
        handler.send_header("ETag", etag)
        if served.ranges:
            handler.send_header("Accept-Ranges", "bytes")
        if status == 206:
            handler.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        for name, value in served.headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        drop = served.drop_after if status == 200 else None
        if drop is not None:
            served.drop_after = None  # once
        sent = 0
        try:
            for block in served.read(start, end):
                if drop is not None and sent + len(block) >= drop:
                    handler.wfile.write(block[: drop - sent])
                    handler.wfile.flush()
                    handler.close_connection = True
                    return
                if served.pause_after is not None and sent <= served.pause_after < sent + len(
                    block
                ):
                    cut = served.pause_after - sent
                    handler.wfile.write(block[:cut])
                    handler.wfile.flush()
                    served.paused.set()
                    served.go.wait(timeout=60)
                    block = block[cut:]
                    sent += cut
                handler.wfile.write(block)
                sent += len(block)
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True
