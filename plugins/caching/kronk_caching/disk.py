"""The host tier's file-system access: which files it reads, and how long it waits for one.

A cache directory (shared by servers, written by older versions, hit by disk faults) can
hold anything under an entry's name: a FIFO, a device, a directory, a symbolic link to
/dev/zero, a file cut short. `open_regular` opens only regular files, never following a
link and never waiting for a FIFO's writer, and says how much the file held when opened,
so that declared sizes are checked against it before anything is read or allocated.
`DiskCalls` runs file-system work on a thread of its own and waits for it a bounded time,
so a file system that stops answering (an unreachable NFS server) costs a request its
cached prefix, never the engine its thread.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from io import FileIO
from pathlib import Path
from typing import TypeVar, cast

log = logging.getLogger(__name__)

T = TypeVar("T")

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)


class Refused(ValueError):
    """A file the host tier does not read: not a regular file, or not what its format
    says it holds."""


def not_regular(mode: int) -> str | None:
    """Why a file of this mode is no regular file (None: it is one)."""
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def check_regular(path: Path) -> int:
    """The size of the regular file at `path`, without following a link or opening it;
    Refused when it is something else, OSError when it is not there."""
    status = os.lstat(path)
    kind = not_regular(status.st_mode)
    if kind is not None:
        raise Refused(kind)
    return status.st_size


@contextmanager
def open_regular(path: Path) -> Iterator[tuple[FileIO, int]]:
    """The regular file at `path`, open for reading, and its size when opened.

    Refused for a symbolic link, a FIFO, a device or a directory: opened with O_NOFOLLOW
    and O_NONBLOCK (a FIFO's open returns at once), then checked on the descriptor, so
    what is read is what was checked.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused("a symbolic link") from None
        raise
    try:
        status = os.fstat(fd)
        kind = not_regular(status.st_mode)
        if kind is not None:
            raise Refused(kind)
    except BaseException:
        os.close(fd)
        raise
    with FileIO(fd, "rb") as file:
        yield file, status.st_size


def read_exactly(file: FileIO, count: int) -> bytes:
    """The next `count` bytes of an open regular file (callers ask for no more than the
    size it had when opened); Refused if it ends before them (cut short meanwhile)."""
    chunks: list[bytes] = []
    left = count
    while left:
        chunk = file.read(left)
        if not chunk:
            raise Refused(f"cut short: {count - left} of {count} bytes")
        chunks.append(chunk)
        left -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class DiskTimeout(TimeoutError):
    """A file-system call that has not returned in time (an OSError, as a failed one)."""


class DiskCalls:
    """File-system calls, one at a time, each on a thread of its own that the caller waits
    for at most `timeout` seconds.

    A call still running past that raises DiskTimeout, and so does every later one at once
    until it has returned: the caller goes on without the disk meanwhile (a thread stuck
    in the kernel cannot be stopped; it is a daemon, left to finish). A call must not
    touch its caller's state: what it returns is applied by the caller, so a call that
    finishes late changes nothing.
    """

    def __init__(self, where: Path | None, timeout: float) -> None:
        self._where = where
        self._timeout = timeout
        self._running: threading.Thread | None = None
        self._since = 0.0
        self._stalled = False  # its warning is logged once per call that overran

    def __call__(self, call: Callable[[], T]) -> T:
        running = self._running
        if running is not None and running.is_alive():
            raise DiskTimeout(
                f"a file-system call under {self._where} has not returned for "
                f"{time.monotonic() - self._since:.0f} s"
            )
        if self._stalled:
            log.info("host cache: the file system under %s answers again", self._where)
            self._stalled = False
        outcome: list[tuple[bool, object]] = []

        def run() -> None:
            try:
                outcome.append((True, call()))
            except BaseException as exc:  # raised again on the caller's thread
                outcome.append((False, exc))

        thread = threading.Thread(target=run, name="kronk-host-cache-disk", daemon=True)
        self._running, self._since = thread, time.monotonic()
        thread.start()
        thread.join(self._timeout)
        if not outcome:
            self._stalled = True
            log.warning(
                "host cache: a file-system call under %s has not returned in %.0f s "
                "(host_cache_disk_timeout); going on without the disk until it does",
                self._where,
                self._timeout,
            )
            raise DiskTimeout(f"no answer from the file system under {self._where}")
        done, value = outcome[0]
        if not done:
            assert isinstance(value, BaseException)
            raise value
        return cast(T, value)
