"""The host-memory tier: sequence states of evicted conversations, in RAM and optionally on disk.

Bounded by bytes: which conversations leave RAM first follows what restores more on the
traffic seen (eviction.py: the least recently used, or keep what it holds). On disk,
entries live under a fingerprint of the model file and the KV-shaping config, so a
different model or layout never restores a wrong state. The disk is an addition, never a
condition: when its directory cannot be written (gone, read-only, full), conversations are
kept in RAM only and a warning is logged; no request fails for it.

The directory is bounded too, by age (since an entry was last written) and by bytes
(least recently written first). Any server sharing it removes what is past the bounds,
other servers' entries included: the tokens file (the index) goes first, so nobody
starts reading an entry being removed, and a reader that opened a file before keeps
reading all of it (an unlinked file lives on while open). A reader that comes too late
finds no file and rebuilds; nobody reads half an entry.

Whatever else is in the directory (a FIFO, a device or a directory under an entry's name,
a symbolic link, a file cut short or declaring more than it holds: disk faults, older
versions, other users) is skipped with one warning per file, never read past its size and
never a failed request (disk.py reads only regular files). Every file-system call runs
under DiskCalls: a disk that stops answering delays the engine by host_cache_disk_timeout
at most, then the tier goes on without it until it answers again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np

from kronk_caching.disk import (
    DiskCalls,
    DiskTimeout,
    Refused,
    check_regular,
    open_regular,
    read_exactly,
)
from kronk_caching.eviction import Duel, Placement, continued, place
from kronk_caching.prefix import token_key
from kronk_core.contract import Adapters, common_prefix

log = logging.getLogger(__name__)

_T = TypeVar("_T")

_SUFFIXES = (".tokens", ".checkpoints", ".state")  # the order an entry is removed in
# A writer renames an entry's files into place within moments: files of an entry without
# its tokens file, or partial files, this much older are a dead writer's leftovers.
LEFTOVER_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The untrimmable part of a sequence's state (sliding-window cells, recurrent state)
    when it held `length` tokens: what cuts it back below its trim floor. It can cut the
    sequence back to any length from `floor` (the trim floor when it was taken: the window
    cells it holds reach back that far) to `length`."""

    length: int
    state: bytes
    floor: int

    @property
    def span(self) -> tuple[int, int]:
        return self.floor, self.length

    def reaches(self, length: int) -> bool:
        return self.floor <= length <= self.length


def through(spans: Sequence[tuple[int, int]], keep: int) -> int:
    """The longest prefix, at most `keep` tokens, that a checkpoint of these (floor,
    length) spans cuts a sequence back to; 0 if none does."""
    return max((min(keep, length) for floor, length in spans if floor <= keep), default=0)


@dataclass(slots=True)
class StoredConversation:
    tokens: tuple[int, ...]
    state: bytes | None  # None: only on disk
    file: Path | None
    # The state, once restored, can be cut back to this length and no shorter
    # (TextModel.trim_floor when it was saved)...
    floor: int = 0
    # ...or, through a checkpoint, to a length in one of these (floor, length) spans
    # (ascending by length).
    checkpoint_spans: tuple[tuple[int, int], ...] = ()
    checkpoints: tuple[Checkpoint, ...] | None = ()  # None: only on disk
    # The LoRA adapters it was decoded under: a prompt under others never restores it.
    adapters: Adapters = ()

    @property
    def ram_bytes(self) -> int:
        held = len(self.state) if self.state is not None else 0
        return held + sum(len(c.state) for c in self.checkpoints or ())

    def keeps(self, length: int) -> bool:
        """Whether the state can be cut back to exactly `length` tokens."""
        return length >= min(self.floor, len(self.tokens)) or any(
            floor <= length <= end for floor, end in self.checkpoint_spans
        )


# A tokens file's (inode, mtime_ns, size): a file renamed into its place is another file.
Identity = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class _Found:
    """An entry a directory scan read: its files' stem, tokens, floor and checkpoint
    spans, and why its checkpoints file was refused (it then has none)."""

    file: Path
    tokens: tuple[int, ...]
    floor: int
    spans: tuple[tuple[int, int], ...]
    checkpoints_refused: tuple[Path, str] | None = None


@dataclass(slots=True)
class _Scan:
    """What one look at the directory found (read on the disk thread, applied by the store)."""

    changed: int  # the directory's mtime_ns
    gone: set[Path] = field(default_factory=set)  # disk-only entries whose index went
    found: list[_Found] = field(default_factory=list)
    # Stem → its tokens file's identity, for every entry skipped: an unchanged file is not
    # read again at the next look.
    refused: dict[Path, Identity] = field(default_factory=dict)
    warnings: list[tuple[Path, str]] = field(default_factory=list)  # newly skipped files
    names: frozenset[str] = frozenset()  # what the directory holds


class _Skipped(Exception):
    """A file of an entry that is not read: which, why, and its entry's tokens file's
    identity (None where that is gone too)."""

    def __init__(self, path: Path, why: str, identity: Identity | None) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why
        self.identity = identity


class HostStore:
    def __init__(
        self,
        *,
        max_bytes: int,
        directory: Path | None,
        fingerprint: str,
        shared: bool = False,
        disk_max_bytes: int = 0,
        disk_max_age: float = 0.0,
        expire_every: float = 60.0,
        max_tokens: int | None = None,
        max_file_bytes: int | None = None,
        disk_timeout: float = 30.0,
    ) -> None:
        self._max_bytes = max_bytes
        # The directory's bounds (0: none), checked at most every `expire_every` seconds.
        self._disk_max_bytes = disk_max_bytes
        self._disk_max_age = disk_max_age
        self._expire_every = expire_every
        self._expired_at = 0.0
        # What a file on disk may hold, at most (None: no bound): the tokens of a slot's
        # context (the fingerprint includes it), and bytes per file.
        self._max_tokens = max_tokens
        self._max_file_bytes = max_file_bytes
        # Shared with other servers: their entries are picked up when the directory changes.
        self._shared = shared
        self._scanned_at = 0
        # Least recently used first, unless the duel's placement keeps what is here.
        self._entries: OrderedDict[bytes, StoredConversation] = OrderedDict()
        self._bytes = 0
        # Key → prompt tokens its last restore kept, for conversations restored from here.
        self._restored: dict[bytes, int] = {}
        self._duel = Duel(max_bytes) if max_bytes else None
        self._placement = Placement.recent
        self._directory = directory / fingerprint if directory is not None else None
        self._disk = DiskCalls(self._directory, disk_timeout)
        # Entries skipped (stem → its tokens file's identity), and the files warned about:
        # one warning per file, however often the directory is looked at.
        self._refused: dict[Path, Identity] = {}
        self._warned: set[Path] = set()
        # Whether the last disk write failed (its warning is logged once until one succeeds).
        self._disk_failing = False
        if self._directory is not None:
            made = self._directory
            try:
                self._disk(lambda: made.mkdir(parents=True, exist_ok=True))
            except OSError as exc:
                self._disk_failed(exc)
            else:
                self.expire()
                self._load_index()

    @property
    def ram_bytes(self) -> int:
        return self._bytes

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @property
    def placement(self) -> Placement:
        """Which conversations leave RAM first now (eviction.py)."""
        return self._placement

    def __len__(self) -> int:
        return len(self._entries)

    def put(
        self,
        tokens: Sequence[int],
        state: bytes,
        floor: int = 0,
        checkpoints: Sequence[Checkpoint] = (),
        adapters: Adapters = (),
    ) -> None:
        """Keep this conversation's state; drop stored conversations it extends, where it
        can be cut back to them (a sliding window's state often cannot: the shorter one
        then stays, for branches that leave the conversation there). One decoded under
        LoRA adapters stays in RAM: the disk's entries are the model's own weights'."""
        key = token_key(tokens, adapters)
        ordered = tuple(sorted(checkpoints, key=lambda c: c.length))
        entry = StoredConversation(
            tuple(tokens), state, None, floor, tuple(c.span for c in ordered), ordered, adapters
        )
        extends = [
            k
            for k in continued(self._restored, lambda k: self._entries[k].tokens, tokens)
            if self._entries[k].adapters == adapters
        ]
        kept = max((self._restored[k] for k in extends), default=0)
        superseded = [
            k
            for k, e in self._entries.items()
            if e.adapters == adapters
            and _is_prefix(e.tokens, tokens)
            and entry.keeps(len(e.tokens))
        ]
        if self._directory is not None and not adapters:
            # Written before what it supersedes leaves the disk: a process killed in
            # between leaves both there, never neither (a conversation written through
            # keeps its previous turn until the next one is whole).
            entry.file = self._write(self._directory / hashlib.sha256(key).hexdigest(), entry)
        for other in superseded:
            # The same conversation's files were just replaced (or, where the disk
            # refused, removed) by the write.
            self._drop(other, unlink=other != key)
        self._entries[key] = entry
        self._bytes += entry.ram_bytes
        if kept:
            self._restored[key] = kept
        if self._duel is not None:
            churn = self._duel.churn()
            light = StoredConversation(entry.tokens, None, None, floor, entry.checkpoint_spans)
            self._duel.put(key, light, entry.ram_bytes, churn)
            self._follow(self._duel.placement)
            place(self._placement, self._entries, key, extends, churn)
        self._shrink()
        if time.monotonic() - self._expired_at >= self._expire_every:
            self.expire()

    def _write(self, file: Path, entry: StoredConversation) -> Path | None:
        """Write an entry's files; None (and nothing on disk) when the disk refuses."""
        assert entry.state is not None and entry.checkpoints is not None
        state, checkpoints = entry.state, entry.checkpoints
        index = [entry.floor, *entry.tokens]
        try:
            self._disk(lambda: _write_entry(file, state, checkpoints, index))
        except OSError as exc:
            self._disk_failed(exc)
            return None
        if self._disk_failing:
            log.info("host cache: writing to %s works again", self._directory)
            self._disk_failing = False
        return file

    def _disk_failed(self, exc: OSError) -> None:
        if not self._disk_failing:
            log.warning(
                "host cache: cannot write to %s (%s); keeping conversations in RAM only",
                self._directory,
                exc,
            )
        self._disk_failing = True

    def best(
        self,
        prompt: Sequence[int],
        usable: Callable[[StoredConversation, int], int],
        adapters: Adapters = (),
    ) -> tuple[int, StoredConversation | None]:
        """The entry that keeps the most of the prompt, and how much: for each entry,
        `usable(entry, shared prefix)` says how much of it a restore can keep. The
        longest raw match is often a longer branch a sliding window cannot cut back to
        where the prompt leaves it; a shorter one (the conversation's own last turn)
        then serves. Ties go to the most recently used."""
        if self._shared:
            self._refresh()
        best_keep, best_key = 0, b""
        for key, entry in self._entries.items():
            if entry.adapters != adapters:
                continue
            keep = usable(entry, common_prefix(entry.tokens, prompt))
            if keep and keep >= best_keep:
                best_keep, best_key = keep, key
        if self._duel is not None:
            self._duel.lookup(prompt, usable)
        if not best_keep:
            return 0, None
        self._entries.move_to_end(best_key)
        self._restored[best_key] = best_keep
        return best_keep, self._entries[best_key]

    def _follow(self, placement: Placement) -> None:
        if placement is self._placement:
            return
        self._placement = placement
        if placement is Placement.keep:
            log.info(
                "host cache: conversations come back in a cycle longer than it holds; "
                "keeping those it has rather than the least recently used"
            )
        else:
            log.info("host cache: evicting the least recently used conversations again")

    def state_of(self, entry: StoredConversation) -> bytes | None:
        """The entry's state (read from disk when not in RAM). None where it cannot be
        had: a file that is gone or skipped takes its entry out of the index."""
        if entry.state is not None:
            return entry.state
        if entry.file is None:
            return None
        stem, limit = entry.file, self._max_file_bytes
        try:
            return self._disk(lambda: _read_state(stem, limit))
        except DiskTimeout:
            return None  # the disk may answer again; the entry stays
        except FileNotFoundError:
            pass  # removed meanwhile (another server expired it)
        except _Skipped as skipped:
            self._skip(stem, skipped)
        self._forget_entry(entry)
        return None

    def checkpoints_of(self, entry: StoredConversation) -> tuple[Checkpoint, ...]:
        """The entry's checkpoints (read from disk when not in RAM; none if unreadable,
        and the entry is then no longer offered for a cut below its floor)."""
        if entry.checkpoints is not None:
            return entry.checkpoints
        if entry.file is None:
            return ()
        stem, count, limit = entry.file, len(entry.tokens), self._max_file_bytes
        try:
            return self._disk(lambda: _read_checkpoints(stem, count, limit))
        except DiskTimeout:
            return ()
        except FileNotFoundError:
            pass
        except _Skipped as skipped:
            self._warn(skipped.path, skipped.why)
        entry.checkpoint_spans, entry.checkpoints = (), ()
        return ()

    def _warn(self, path: Path, why: str) -> None:
        if path not in self._warned:
            self._warned.add(path)
            log.warning("host cache: skipping %s: %s", path, why)

    def _skip(self, stem: Path, skipped: _Skipped) -> None:
        """An entry not to read again until its tokens file changes."""
        self._warn(skipped.path, skipped.why)
        if skipped.identity is not None:
            self._refused[stem] = skipped.identity

    def _forget_entry(self, entry: StoredConversation) -> None:
        key = token_key(entry.tokens, entry.adapters)
        if self._entries.get(key) is entry:
            self._bytes -= entry.ram_bytes
            self._forget(key)

    def _shrink(self) -> None:
        """Evict RAM copies, least recently used first, until under budget."""
        for key, entry in list(self._entries.items()):
            if self._bytes <= self._max_bytes:
                return
            if entry.state is None:
                continue
            self._bytes -= entry.ram_bytes
            if entry.file is not None and self._on_disk(entry.file):
                entry.state = entry.checkpoints = None  # still on disk
            else:  # never written, or removed from the disk since (another server expired it)
                self._forget(key)

    def _on_disk(self, stem: Path) -> bool:
        index = stem.with_suffix(".tokens")
        try:
            return self._disk(lambda: os.path.lexists(index))
        except OSError:
            return False  # not known to be there: not offered from there

    def _drop(self, key: bytes, *, unlink: bool = True) -> None:
        entry = self._forget(key)
        self._bytes -= entry.ram_bytes
        if unlink and entry.file is not None:
            stem = entry.file
            with contextlib.suppress(OSError):  # a disk that does not answer keeps it
                self._disk(lambda: _remove(stem))

    def _forget(self, key: bytes) -> StoredConversation:
        self._restored.pop(key, None)
        return self._entries.pop(key)

    def expire(self) -> None:
        """Remove the directory's entries past its bounds (whoever wrote them) and dead
        writers' leftovers; this server's RAM copies of removed entries stay in RAM."""
        self._expired_at = time.monotonic()
        directory = self._directory
        if directory is None or not (self._disk_max_bytes or self._disk_max_age):
            return
        max_age, max_bytes = self._disk_max_age, self._disk_max_bytes
        try:
            removed = self._disk(lambda: _expired(directory, max_age, max_bytes))
        except OSError:
            return
        if not removed:
            return
        for key, entry in list(self._entries.items()):
            if entry.file in removed:
                entry.file = None
                if entry.state is None:
                    self._forget(key)
        log.info(
            "host cache: removed %d conversations past its bounds from %s",
            len(removed),
            self._directory,
        )

    def _refresh(self) -> None:
        """Pick up the entries other servers wrote since the last look, and forget the
        disk-only ones they dropped (a rename into place or an unlink touches the
        directory's mtime, so an unchanged directory costs one stat)."""
        self._load_index(unless_unchanged=True)

    def _load_index(self, *, unless_unchanged: bool = False) -> None:
        directory = self._directory
        assert directory is not None
        known = {entry.file for entry in self._entries.values() if entry.file is not None}
        disk_only = {e.file for e in self._entries.values() if e.state is None and e.file}
        unchanged_at = self._scanned_at if unless_unchanged else None
        refused, limits = dict(self._refused), (self._max_tokens, self._max_file_bytes)
        try:
            scan = self._disk(
                lambda: _scan(directory, known, disk_only, refused, limits, unchanged_at)
            )
        except DiskTimeout:
            return
        except OSError as exc:
            self._warn(directory, _why(exc))
            return
        if scan is None:
            return
        self._scanned_at = scan.changed
        for key, entry in list(self._entries.items()):
            if entry.state is None and entry.file in scan.gone:
                self._forget(key)
        self._refused = scan.refused
        self._warned = {path for path in self._warned if path.name in scan.names}
        for path, why in scan.warnings:
            self._warn(path, why)
        for found in scan.found:
            if found.checkpoints_refused is not None:
                self._warn(*found.checkpoints_refused)
            # A refused checkpoints file: known to hold none, never read again.
            checkpoints = () if found.checkpoints_refused is not None else None
            self._entries[token_key(found.tokens)] = StoredConversation(
                found.tokens, None, found.file, found.floor, found.spans, checkpoints
            )
        if scan.found and not unless_unchanged:
            log.info("host cache: %d conversations on disk in %s", len(self._entries), directory)


# ---- the disk's side: what runs on DiskCalls' thread, touching no store --------------


def _write_entry(
    file: Path, state: bytes, checkpoints: Sequence[Checkpoint], index: Sequence[int]
) -> None:
    """Write an entry's files, or none of them (OSError).

    Each file is written aside and renamed into place, the tokens file (the index) last,
    so a write cut short never leaves an entry that looks whole.
    """
    names = (".state", ".checkpoints", ".tokens")
    final = [file.with_suffix(name) for name in names]
    # A name of this writer's own: two servers writing the same conversation into a
    # shared directory never write into one file; each rename is atomic.
    mine = f"{os.getpid()}-{secrets.token_hex(4)}"
    partial = [file.with_suffix(f"{name}.{mine}.partial") for name in names]
    try:
        file.parent.mkdir(parents=True, exist_ok=True)  # back, if it was removed
        partial[0].write_bytes(state)
        partial[0].replace(final[0])
        partial[1].write_bytes(_pack_checkpoints(checkpoints))
        partial[1].replace(final[1])
        # The floor first, then the tokens.
        np.asarray(index, dtype=np.int32).tofile(partial[2])
        partial[2].replace(final[2])
    except OSError:
        for path in (*partial, *final):
            _unlink(path)
        raise


def _identity(path: Path) -> Identity:
    status = os.lstat(path)
    return status.st_ino, status.st_mtime_ns, status.st_size


def _why(exc: BaseException) -> str:
    if isinstance(exc, Refused):
        return str(exc)
    if isinstance(exc, MemoryError):
        return "too large to read"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


def _reading(stem: Path, path: Path, read: Callable[[], _T]) -> _T:
    """`read()`, with whatever it raises but a missing file as _Skipped naming `path`."""
    try:
        return read()
    except FileNotFoundError:
        raise
    except Exception as exc:
        identity = None
        with contextlib.suppress(OSError):
            identity = _identity(stem.with_suffix(".tokens"))
        raise _Skipped(path, _why(exc), identity) from None


def _scan(
    directory: Path,
    known: Collection[Path],
    disk_only: Collection[Path],
    refused: Mapping[Path, Identity],
    limits: tuple[int | None, int | None],
    unchanged_at: int | None,
) -> _Scan | None:
    """The directory's entries not in `known`, which of `disk_only` lost their tokens
    file, and what was skipped; None if its mtime is still `unchanged_at`."""
    changed = directory.stat().st_mtime_ns
    if changed == unchanged_at:
        return None
    scan = _Scan(changed)
    scan.gone = {stem for stem in disk_only if not os.path.lexists(stem.with_suffix(".tokens"))}
    with os.scandir(directory) as listing:
        scan.names = frozenset(item.name for item in listing)
    for name in sorted(name for name in scan.names if name.endswith(".tokens")):
        stem = (directory / name).with_suffix("")
        if stem in known:
            continue
        try:
            identity = _identity(stem.with_suffix(".tokens"))
            if refused.get(stem) == identity:
                scan.refused[stem] = identity
                continue
            scan.found.append(_read_entry(stem, *limits))
        except FileNotFoundError:
            continue  # removed meanwhile
        except _Skipped as skipped:
            if skipped.identity is not None:
                scan.refused[stem] = skipped.identity
            scan.warnings.append((skipped.path, skipped.why))
    return scan


def _read_entry(stem: Path, max_tokens: int | None, max_file_bytes: int | None) -> _Found:
    tokens_file, state_file = stem.with_suffix(".tokens"), stem.with_suffix(".state")
    floor, tokens = _reading(stem, tokens_file, lambda: _read_tokens(tokens_file, max_tokens))
    _reading(stem, state_file, lambda: _check_state(state_file, max_file_bytes))
    checkpoints_file = stem.with_suffix(".checkpoints")
    try:
        spans = _checkpoint_spans(checkpoints_file, len(tokens))
    except FileNotFoundError:  # entries written before checkpoints were stored have none
        return _Found(stem, tokens, floor, ())
    except Exception as exc:
        return _Found(stem, tokens, floor, (), (checkpoints_file, _why(exc)))
    return _Found(stem, tokens, floor, spans)


def _read_tokens(path: Path, max_tokens: int | None) -> tuple[int, tuple[int, ...]]:
    """A tokens file: the state's trim floor, then the tokens (int32 each)."""
    with open_regular(path) as (file, size):
        if size < 4 or size % 4:
            raise Refused(f"{size} bytes: not a floor and whole 32-bit tokens")
        count = size // 4 - 1
        if max_tokens is not None and count > max_tokens:
            raise Refused(f"{count} tokens, more than a slot's context of {max_tokens}")
        values = np.frombuffer(read_exactly(file, size), dtype=np.int32)
    floor = int(values[0])
    if floor < 0:
        raise Refused(f"a negative trim floor ({floor})")
    return floor, tuple(values[1:].tolist())


def _check_state(path: Path, max_bytes: int | None) -> int:
    size = check_regular(path)
    _check_file_size(size, max_bytes)
    return size


def _check_file_size(size: int, max_bytes: int | None) -> None:
    if not size:
        raise Refused("empty")
    if max_bytes is not None and size > max_bytes:
        raise Refused(f"{size} bytes, more than a state of this model takes ({max_bytes} at most)")


def _read_state(stem: Path, max_bytes: int | None) -> bytes:
    path = stem.with_suffix(".state")

    def read() -> bytes:
        with open_regular(path) as (file, size):
            _check_file_size(size, max_bytes)
            return read_exactly(file, size)

    return _reading(stem, path, read)


def _read_checkpoints(stem: Path, n_tokens: int, max_bytes: int | None) -> tuple[Checkpoint, ...]:
    path = stem.with_suffix(".checkpoints")

    def read() -> tuple[Checkpoint, ...]:
        with open_regular(path) as (file, size):
            _check_file_size(size, max_bytes)
            return _unpack_checkpoints(read_exactly(file, size), n_tokens)

    return _reading(stem, path, read)


def _expired(directory: Path, max_age: float, max_bytes: int) -> set[Path]:
    """Remove the entries past the directory's bounds and dead writers' leftovers; the
    stems of the entries removed. Never follows a link: a link's own age and size count."""
    now = time.time()
    entries: list[tuple[float, int, Path]] = []  # (written at, bytes, entry)
    listing = list(directory.iterdir())
    indexed = {path.with_suffix("") for path in listing if path.suffix == ".tokens"}
    for path in listing:
        try:
            status = path.lstat()
        except OSError:
            continue  # removed meanwhile
        stem = path.with_suffix("")
        if path.suffix == ".tokens":
            size = status.st_size + sum(_size(stem.with_suffix(s)) for s in _SUFFIXES[1:])
            entries.append((status.st_mtime, size, stem))
        elif stem not in indexed and now - status.st_mtime > LEFTOVER_SECONDS:
            _unlink(path)  # a partial file, or the rest of an entry never indexed
    entries.sort()
    total = sum(size for _, size, _ in entries)
    removed = set()
    for written, size, stem in entries:
        too_old = max_age and now - written > max_age
        too_big = max_bytes and total > max_bytes
        if not (too_old or too_big):
            break  # the rest are younger, and they fit
        _remove(stem)
        removed.add(stem)
        total -= size
    return removed


# A checkpoints file (int64s): FLOORS_MARK, their count, each one's length, floor and size,
# then their states. A file written before checkpoints had floors starts with the count
# (never negative) and has no floor: each such checkpoint reaches only its own length.
FLOORS_MARK = -2


def _pack_checkpoints(checkpoints: Sequence[Checkpoint]) -> bytes:
    header = [FLOORS_MARK, len(checkpoints)]
    header += [n for c in checkpoints for n in (c.length, c.floor, len(c.state))]
    return np.asarray(header, dtype=np.int64).tobytes() + b"".join(c.state for c in checkpoints)


def _header_layout(head: bytes, size: int) -> tuple[int, int, int]:
    """From a checkpoints file's first 16 bytes (fewer if it is shorter) and its size:
    where its rows start and its header ends, and how many fields a row has (3 with
    floors, 2 in the older format). Refused where the file cannot hold the header its
    count declares, before anything of that size is read."""
    marked = len(head) >= 8 and int(np.frombuffer(head[:8], dtype=np.int64)[0]) == FLOORS_MARK
    start, fields = (8, 3) if marked else (0, 2)
    if len(head) < start + 8:
        raise Refused(f"cut short: {size} bytes, no checkpoint count")
    count = int(np.frombuffer(head[start : start + 8], dtype=np.int64)[0])
    if count < 0:
        raise Refused(f"a negative checkpoint count ({count})")
    end = start + 8 + 8 * fields * count
    if end > size:
        raise Refused(f"it declares {count} checkpoints, more than its {size} bytes can hold")
    return start + 8, end, fields


def _read_header(data: bytes, size: int, n_tokens: int) -> tuple[list[tuple[int, int, int]], int]:
    """(length, floor, size) of each checkpoint, and where their states start, from `data`
    (the file's first bytes, its header at least) and the file's size: Refused unless the
    states take exactly the rest of the file and each checkpoint lies within the
    conversation's `n_tokens`."""
    begin, end, fields = _header_layout(data[:16], size)
    rows = np.frombuffer(data[begin:end], dtype=np.int64).reshape(-1, fields)
    if fields == 3:
        header = [(int(length), int(floor), int(nbytes)) for length, floor, nbytes in rows]
    else:
        header = [(int(length), int(length), int(nbytes)) for length, nbytes in rows]
    for length, floor, state_size in header:
        if not (0 <= floor <= length <= n_tokens and state_size >= 0):
            raise Refused(
                f"a checkpoint of {state_size} bytes at {length} tokens (floor {floor}) in a "
                f"conversation of {n_tokens}"
            )
    states = sum(state_size for _, _, state_size in header)
    if end + states != size:
        raise Refused(f"its checkpoints declare {states} bytes, the file holds {size - end}")
    return header, end


def _unpack_checkpoints(data: bytes, n_tokens: int) -> tuple[Checkpoint, ...]:
    header, offset = _read_header(data, len(data), n_tokens)
    checkpoints = []
    for length, floor, size in header:
        checkpoints.append(Checkpoint(length, data[offset : offset + size], floor))
        offset += size
    return tuple(checkpoints)


def _checkpoint_spans(path: Path, n_tokens: int) -> tuple[tuple[int, int], ...]:
    """The (floor, length) spans in a checkpoints file's header, read without its states."""
    with open_regular(path) as (file, size):
        head = read_exactly(file, min(16, size))
        _, end, _ = _header_layout(head, size)
        header, _ = _read_header(head + read_exactly(file, max(0, end - len(head))), size, n_tokens)
    return tuple((floor, length) for length, floor, _ in header)


def _is_prefix(short: Sequence[int], long: Sequence[int]) -> bool:
    return len(short) <= len(long) and common_prefix(short, long) == len(short)


def _remove(stem: Path) -> None:
    """An entry's files, its index first."""
    for suffix in _SUFFIXES:
        _unlink(stem.with_suffix(suffix))


def _size(path: Path) -> int:
    try:
        return path.lstat().st_size
    except OSError:
        return 0


def _unlink(path: Path) -> None:
    # The directory itself may be gone or unwritable: nothing to clean up there then.
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)
