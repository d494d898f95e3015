"""The one downloader behind `kronk model pull`, `kronk catalog pull` and the server's pulls.

A file is written to `<name>.partial` beside its destination and becomes
visible (an atomic rename) only once it is whole and its sha256 matches: a
model file under `<base>/models` is always complete. An interrupted download
resumes where it stopped (HTTP Range, with If-Range so that a file changed
upstream starts over). Two pulls of one file share one transfer: in one
process by joining it, across processes through a lock file.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import httpx

from kronk_core import __version__
from kronk_core.contract import InvalidRequestError, KronkError

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
CHUNK_BYTES = 1 << 20
# Left free on the disk beyond the file itself.
DISK_MARGIN_BYTES = 64 << 20
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
# A Hub file's path: /owner/repo/resolve/REVISION/path.
_HUB_FILE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/")

# How many bytes of the file are there now (it may go back to 0 when a download starts
# over), and its size when known.
Listener = Callable[[int, int | None], None]


class PullError(KronkError):
    """The remote side failed: an HTTP error, a dropped connection past the retries."""

    status = 502
    code = "pull_failed"


class HubAccessError(PullError):
    """The Hub would not give a gated or private model's files without a (better) token."""

    code = "hub_access_denied"


# How to give the Hub a token, for the messages of refusals.
TOKEN_ADVICE = "set HF_TOKEN or run `hf auth login`"


class ChecksumError(PullError):
    """The downloaded bytes are not the ones the catalog (or the Hub) promised."""

    code = "checksum_mismatch"


class NotGGUFError(InvalidRequestError):
    """The URL answers with something that is not a GGUF file (an HTML page, say)."""

    code = "not_gguf"


class DiskFullError(KronkError):
    status = 507
    code = "insufficient_storage"


@dataclass(frozen=True)
class FileSpec:
    """One file to fetch: from `url` to `dest`, with what is known of it beforehand."""

    url: str
    dest: Path
    size: int | None = None
    sha256: str | None = None


@dataclass(eq=False)
class _Transfer:
    """One file's download, which every pull of that file listens to."""

    listeners: list[Listener] = field(default_factory=list)
    position: int = 0
    size: int | None = None
    task: asyncio.Future[None] | None = None

    def moved(self, position: int, size: int | None) -> None:
        self.position, self.size = position, size
        for listener in list(self.listeners):
            listener(position, size)


def _partial(dest: Path) -> Path:
    return dest.with_name(dest.name + ".partial")


def _resume_record(dest: Path) -> Path:
    return dest.with_name(dest.name + ".partial.json")


def _lock_file(dest: Path) -> Path:
    return dest.with_name(dest.name + ".lock")


def _discard(dest: Path) -> None:
    """Drop a download that cannot be resumed: its partial file and its resume record."""
    _partial(dest).unlink(missing_ok=True)
    _resume_record(dest).unlink(missing_ok=True)


def _disk_error(exc: OSError, dest: Path) -> KronkError | None:
    if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return DiskFullError(f"no room left to write {dest.name}: {os.strerror(exc.errno)}")
    return None


@contextlib.contextmanager
def _locked(dest: Path) -> Iterator[None]:
    """Hold `<dest>.lock` (blocking): one process at a time writes a file's partial."""
    path = _lock_file(dest)
    while True:
        handle = path.open("a+b")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # Said before waiting, so a pull that seems stuck says why.
            log.warning("%s is being downloaded by another process; waiting for it", dest.name)
            fcntl.flock(handle, fcntl.LOCK_EX)
        # The holder before us removed the file we waited on: lock the current one.
        if os.fstat(handle.fileno()).st_nlink > 0:
            break
        handle.close()
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        handle.close()


class Downloader:
    """Fetches files over one httpx client; the Hugging Face token goes to its host only."""

    def __init__(
        self,
        *,
        hf_endpoint: str,
        hf_token: str | None = None,
        read_timeout: float = 60.0,
        retries: int = 4,
    ) -> None:
        self._token_host = urlsplit(hf_endpoint).netloc
        self._token = hf_token
        self._retries = retries
        self._read_timeout = read_timeout
        self._transfers: dict[Path, _Transfer] = {}

    async def fetch(self, spec: FileSpec, listener: Listener) -> None:
        """Make `spec.dest` the verified file; join a transfer of it already under way."""
        transfer = self._transfers.get(spec.dest)
        if transfer is not None and transfer.task is not None:
            listener(transfer.position, transfer.size)
            transfer.listeners.append(listener)
            try:
                await asyncio.shield(transfer.task)
            finally:
                transfer.listeners.remove(listener)
            return
        transfer = _Transfer(listeners=[listener])
        transfer.task = asyncio.ensure_future(self._fetch(spec, transfer.moved))
        self._transfers[spec.dest] = transfer
        try:
            await transfer.task
        finally:
            if self._transfers.get(spec.dest) is transfer:
                del self._transfers[spec.dest]

    async def _fetch(self, spec: FileSpec, advance: Listener) -> None:
        if spec.dest.is_file():
            size = spec.dest.stat().st_size
            advance(size, size)
            return
        spec.dest.parent.mkdir(parents=True, exist_ok=True)
        lock = _locked(spec.dest)
        await asyncio.to_thread(lock.__enter__)
        try:
            if spec.dest.is_file():  # another process finished it while we waited
                size = spec.dest.stat().st_size
                advance(size, size)
                return
            await self._download(spec, advance)
        finally:
            lock.__exit__(None, None, None)

    async def _download(self, spec: FileSpec, advance: Listener) -> None:
        partial = _partial(spec.dest)
        attempt = 0
        client = httpx.AsyncClient(
            follow_redirects=True,
            timeout=httpx.Timeout(10.0, read=self._read_timeout),
            headers={"User-Agent": f"kronk/{__version__}"},
        )
        async with client:
            while True:
                try:
                    expected = await self._transfer_once(client, spec, partial, advance)
                    break
                except (httpx.TransportError, _Retry) as exc:
                    attempt += 1
                    if attempt > self._retries:
                        raise PullError(
                            f"downloading {spec.url} failed after {attempt} tries: {exc}"
                        ) from None
                    log.warning("download of %s interrupted (%s); resuming", spec.url, exc)
                    await asyncio.sleep(min(0.25 * 2 ** (attempt - 1), 5.0))
        await asyncio.to_thread(self._verify_and_publish, spec, partial, expected)

    async def _transfer_once(
        self, client: httpx.AsyncClient, spec: FileSpec, partial: Path, advance: Listener
    ) -> str | None:
        """Append the rest of the file to `partial`; return the sha256 to expect, if known."""
        record = _resume_record(spec.dest)
        offset = partial.stat().st_size if partial.is_file() else 0
        headers = self._auth_headers(spec.url)
        saved = _read_record(record, spec.url) if offset else None
        # Resume only what can be checked: the same remote file (If-Range), or a known sha256.
        if offset and (saved is not None or spec.sha256 is not None):
            headers["Range"] = f"bytes={offset}-"
            if saved is not None:
                headers["If-Range"] = saved
        else:
            offset = 0
        async with client.stream("GET", spec.url, headers=headers) as response:
            if response.status_code == 416 and offset:
                partial.unlink(missing_ok=True)  # our partial is longer than the file
                raise _Retry("the partial file does not fit the remote one")
            if response.status_code in (401, 403) and urlsplit(spec.url).netloc == self._token_host:
                raise self._refused(spec.url, response)
            if response.status_code >= 400:
                raise PullError(
                    f"GET {spec.url}: {response.status_code} {response.reason_phrase}",
                    param="url",
                )
            if response.status_code != 206 or not _starts_at(response, offset):
                offset = 0  # no Range support, or the file changed: start over
            remaining = _length(response)
            total = offset + remaining if remaining is not None else spec.size
            if spec.size is not None and total is not None and total != spec.size:
                raise ChecksumError(
                    f"{spec.url} is {total} bytes, the catalog says {spec.size}", param="url"
                )
            self._check_room(spec.dest, (total or 0) - offset)
            validator = response.headers.get("etag") or response.headers.get("last-modified")
            _write_record(record, spec.url, validator)
            expected = spec.sha256 or _hub_sha256(response)
            advance(offset, total)
            with partial.open("r+b" if offset else "wb") as sink:
                sink.seek(offset)
                sink.truncate()
                await self._copy(response, sink, offset, total, spec, advance)
        return expected

    async def _copy(
        self,
        response: httpx.Response,
        sink: IO[bytes],
        offset: int,
        total: int | None,
        spec: FileSpec,
        advance: Listener,
    ) -> None:
        head = b""
        position = offset
        try:
            async for chunk in response.aiter_bytes():
                if offset == 0 and len(head) < len(GGUF_MAGIC):
                    head += chunk[: len(GGUF_MAGIC)]
                    if len(head) >= len(GGUF_MAGIC) and not head.startswith(GGUF_MAGIC):
                        raise NotGGUFError(
                            f"{spec.url} is not a GGUF file (it starts with {head[:16]!r})",
                            param="url",
                        )
                sink.write(chunk)
                position += len(chunk)
                advance(position, total)
            sink.flush()
            os.fsync(sink.fileno())
        except OSError as exc:
            error = _disk_error(exc, spec.dest)
            if error is None:
                raise
            sink.close()
            _discard(spec.dest)
            raise error from None
        except NotGGUFError:
            sink.close()
            _discard(spec.dest)
            raise
        except (httpx.TransportError, httpx.StreamError) as exc:
            raise _Retry(str(exc) or type(exc).__name__) from None

    def _verify_and_publish(self, spec: FileSpec, partial: Path, expected: str | None) -> None:
        digest = hashlib.sha256()
        with partial.open("rb") as source:
            if source.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
                _discard(spec.dest)
                raise NotGGUFError(f"{spec.url} is not a GGUF file", param="url")
            source.seek(0)
            while block := source.read(CHUNK_BYTES):
                digest.update(block)
        actual = digest.hexdigest()
        if expected is not None and actual != expected.lower():
            _discard(spec.dest)
            raise ChecksumError(
                f"{spec.url}: sha256 is {actual}, expected {expected.lower()}; "
                "the download was discarded",
                param="url",
            )
        if expected is None:
            log.warning("%s has no known sha256 (%s); it is not verified", spec.url, actual)
        os.replace(partial, spec.dest)
        _resume_record(spec.dest).unlink(missing_ok=True)
        log.info("pulled %s (sha256 %s)", spec.dest, actual)

    def _refused(self, url: str, response: httpx.Response) -> HubAccessError:
        """The Hub's 401 or 403 for a gated or private model's file, with what to do about it."""
        why = response.headers.get("x-error-message") or response.reason_phrase
        found = _HUB_FILE.match(urlsplit(url).path)
        page = f"{urlsplit(url).scheme}://{self._token_host}" + (
            f"/{found['repo']}" if found else ""
        )
        if self._token:
            advice = f"accept the model's terms on {page} with the account of the token"
        else:
            advice = f"accept the model's terms on {page}, then {TOKEN_ADVICE}"
        return HubAccessError(f"the Hub refused {url} ({response.status_code}: {why}): {advice}")

    def _auth_headers(self, url: str) -> dict[str, str]:
        """The token only for the Hub's own host (httpx drops it on a redirect elsewhere)."""
        if self._token and urlsplit(url).netloc == self._token_host:
            return {"Authorization": f"Bearer {self._token}"}
        return {}

    @staticmethod
    def _check_room(dest: Path, needed: int) -> None:
        free = shutil.disk_usage(dest.parent).free
        if needed + DISK_MARGIN_BYTES > free:
            raise DiskFullError(
                f"not enough disk space for {dest.name}: it needs {needed} bytes "
                f"(+{DISK_MARGIN_BYTES} spare), {free} are free in {dest.parent}"
            )


class _Retry(Exception):
    """The transfer stopped early; try again from where it got to."""


def _length(response: httpx.Response) -> int | None:
    value = response.headers.get("content-length")
    return int(value) if value and value.isdigit() else None


def _starts_at(response: httpx.Response, offset: int) -> bool:
    """Whether a 206 answer starts where our partial file ends (`bytes START-END/SIZE`)."""
    found = re.match(r"bytes (\d+)-", response.headers.get("content-range", ""))
    return found is not None and int(found.group(1)) == offset


def _hub_sha256(response: httpx.Response) -> str | None:
    """The sha256 a Hugging Face Hub gives for a large file (X-Linked-Etag of its redirect)."""
    for earlier in (*response.history, response):
        value = str(earlier.headers.get("x-linked-etag", "")).strip('"').lower()
        if SHA256_HEX.match(value):
            return value
    return None


def _read_record(record: Path, url: str) -> str | None:
    """The validator (ETag or Last-Modified) the partial file was downloaded under."""
    try:
        saved: dict[str, Any] = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    validator = saved.get("validator")
    if saved.get("url") != url or not isinstance(validator, str):
        return None
    return validator


def _write_record(record: Path, url: str, validator: str | None) -> None:
    if validator is None:
        record.unlink(missing_ok=True)
    else:
        record.write_text(json.dumps({"url": url, "validator": validator}), encoding="utf-8")
