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
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kronk_caching.eviction import Duel, Placement, continued, place
from kronk_caching.prefix import token_key
from kronk_core.tokens import common_prefix

log = logging.getLogger(__name__)

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

    @property
    def ram_bytes(self) -> int:
        held = len(self.state) if self.state is not None else 0
        return held + sum(len(c.state) for c in self.checkpoints or ())

    def keeps(self, length: int) -> bool:
        """Whether the state can be cut back to exactly `length` tokens."""
        return length >= min(self.floor, len(self.tokens)) or any(
            floor <= length <= end for floor, end in self.checkpoint_spans
        )


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
    ) -> None:
        self._max_bytes = max_bytes
        # The directory's bounds (0: none), checked at most every `expire_every` seconds.
        self._disk_max_bytes = disk_max_bytes
        self._disk_max_age = disk_max_age
        self._expire_every = expire_every
        self._expired_at = 0.0
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
        # Whether the last disk write failed (its warning is logged once until one succeeds).
        self._disk_failing = False
        if self._directory is not None:
            try:
                self._directory.mkdir(parents=True, exist_ok=True)
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
    ) -> None:
        """Keep this conversation's state; drop stored conversations it extends, where it
        can be cut back to them (a sliding window's state often cannot: the shorter one
        then stays, for branches that leave the conversation there)."""
        key = token_key(tokens)
        ordered = tuple(sorted(checkpoints, key=lambda c: c.length))
        entry = StoredConversation(
            tuple(tokens), state, None, floor, tuple(c.span for c in ordered), ordered
        )
        extends = continued(self._restored, lambda k: self._entries[k].tokens, tokens)
        kept = max((self._restored[k] for k in extends), default=0)
        superseded = [
            k
            for k, e in self._entries.items()
            if _is_prefix(e.tokens, tokens) and entry.keeps(len(e.tokens))
        ]
        if self._directory is not None:
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
        """Write an entry's files; None (and nothing on disk) when the disk refuses.

        Each file is written aside and renamed into place, the tokens file (the
        index) last, so a write cut short never leaves an entry that looks whole.
        """
        assert entry.state is not None and entry.checkpoints is not None
        names = (".state", ".checkpoints", ".tokens")
        final = [file.with_suffix(name) for name in names]
        # A name of this writer's own: two servers writing the same conversation into a
        # shared directory never write into one file; each rename is atomic.
        mine = f"{os.getpid()}-{secrets.token_hex(4)}"
        partial = [file.with_suffix(f"{name}.{mine}.partial") for name in names]
        try:
            file.parent.mkdir(parents=True, exist_ok=True)  # back, if it was removed
            partial[0].write_bytes(entry.state)
            partial[0].replace(final[0])
            partial[1].write_bytes(_pack_checkpoints(entry.checkpoints))
            partial[1].replace(final[1])
            # The floor first, then the tokens.
            np.asarray([entry.floor, *entry.tokens], dtype=np.int32).tofile(partial[2])
            partial[2].replace(final[2])
        except OSError as exc:
            self._disk_failed(exc)
            for path in (*partial, *final):
                _unlink(path)
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
        self, prompt: Sequence[int], usable: Callable[[StoredConversation, int], int]
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
        if entry.state is not None:
            return entry.state
        if entry.file is None:
            return None
        try:
            return entry.file.with_suffix(".state").read_bytes()
        except OSError:
            return None

    def checkpoints_of(self, entry: StoredConversation) -> tuple[Checkpoint, ...]:
        """The entry's checkpoints (read from disk when not in RAM; none if unreadable)."""
        if entry.checkpoints is not None:
            return entry.checkpoints
        if entry.file is None:
            return ()
        try:
            return _unpack_checkpoints(entry.file.with_suffix(".checkpoints").read_bytes())
        except (OSError, ValueError):
            return ()

    def _shrink(self) -> None:
        """Evict RAM copies, least recently used first, until under budget."""
        for key, entry in list(self._entries.items()):
            if self._bytes <= self._max_bytes:
                return
            if entry.state is None:
                continue
            self._bytes -= entry.ram_bytes
            if entry.file is not None and entry.file.with_suffix(".tokens").exists():
                entry.state = entry.checkpoints = None  # still on disk
            else:  # never written, or removed from the disk since (another server expired it)
                self._forget(key)

    def _drop(self, key: bytes, *, unlink: bool = True) -> None:
        entry = self._forget(key)
        self._bytes -= entry.ram_bytes
        if unlink and entry.file is not None:
            _remove(entry.file)

    def _forget(self, key: bytes) -> StoredConversation:
        self._restored.pop(key, None)
        return self._entries.pop(key)

    def expire(self) -> None:
        """Remove the directory's entries past its bounds (whoever wrote them) and dead
        writers' leftovers; this server's RAM copies of removed entries stay in RAM."""
        self._expired_at = time.monotonic()
        if self._directory is None or not (self._disk_max_bytes or self._disk_max_age):
            return
        now = time.time()
        entries: list[tuple[float, int, Path]] = []  # (written at, bytes, entry)
        try:
            listing = list(self._directory.iterdir())
        except OSError:
            return
        indexed = {path.with_suffix("") for path in listing if path.suffix == ".tokens"}
        for path in listing:
            try:
                status = path.stat()
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
            too_old = self._disk_max_age and now - written > self._disk_max_age
            too_big = self._disk_max_bytes and total > self._disk_max_bytes
            if not (too_old or too_big):
                break  # the rest are younger, and they fit
            _remove(stem)
            removed.add(stem)
            total -= size
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
        assert self._directory is not None
        try:
            changed = self._directory.stat().st_mtime_ns
        except OSError:
            return
        if changed == self._scanned_at:
            return
        for key, entry in list(self._entries.items()):
            gone = entry.file is not None and not entry.file.with_suffix(".tokens").exists()
            if entry.state is None and gone:
                self._forget(key)
        self._load_index()

    def _load_index(self) -> None:
        assert self._directory is not None
        with contextlib.suppress(OSError):
            self._scanned_at = self._directory.stat().st_mtime_ns
        known = {entry.file for entry in self._entries.values()}
        for tokens_file in sorted(self._directory.glob("*.tokens")):
            if tokens_file.with_suffix("") in known:
                continue
            try:
                floor, *rest = (int(t) for t in np.fromfile(tokens_file, dtype=np.int32))
            except (OSError, ValueError):
                log.warning("host cache: skipping unreadable entry %s", tokens_file)
                continue
            tokens = tuple(rest)
            file = tokens_file.with_suffix("")
            if file.with_suffix(".state").exists():
                spans = _checkpoint_spans(file.with_suffix(".checkpoints"))
                self._entries[token_key(tokens)] = StoredConversation(
                    tokens, None, file, floor, spans, None
                )
        if self._entries:
            log.info(
                "host cache: %d conversations on disk in %s", len(self._entries), self._directory
            )


# A checkpoints file (int64s): FLOORS_MARK, their count, each one's length, floor and size,
# then their states. A file written before checkpoints had floors starts with the count
# (never negative) and has no floor: each such checkpoint reaches only its own length.
FLOORS_MARK = -2


def _pack_checkpoints(checkpoints: Sequence[Checkpoint]) -> bytes:
    header = [FLOORS_MARK, len(checkpoints)]
    header += [n for c in checkpoints for n in (c.length, c.floor, len(c.state))]
    return np.asarray(header, dtype=np.int64).tobytes() + b"".join(c.state for c in checkpoints)


def _header_layout(data: bytes) -> tuple[int, int, int]:
    """From a checkpoints file's first 16 bytes: where its rows start and its header ends,
    and how many fields a row has (3 with floors, 2 in the older format)."""
    marked = len(data) >= 8 and int(np.frombuffer(data[:8], dtype=np.int64)[0]) == FLOORS_MARK
    start, fields = (8, 3) if marked else (0, 2)
    if len(data) < start + 8:
        raise ValueError("truncated checkpoints file")
    count = int(np.frombuffer(data[start : start + 8], dtype=np.int64)[0])
    if count < 0:
        raise ValueError("truncated checkpoints file")
    return start + 8, start + 8 + 8 * fields * count, fields


def _read_header(data: bytes) -> tuple[list[tuple[int, int, int]], int]:
    """(length, floor, size) of each checkpoint, and where their states start."""
    begin, end, fields = _header_layout(data[:16])
    if len(data) < end:
        raise ValueError("truncated checkpoints file")
    rows = np.frombuffer(data[begin:end], dtype=np.int64).reshape(-1, fields)
    if fields == 3:
        return [(int(length), int(floor), int(size)) for length, floor, size in rows], end
    return [(int(length), int(length), int(size)) for length, size in rows], end


def _unpack_checkpoints(data: bytes) -> tuple[Checkpoint, ...]:
    header, offset = _read_header(data)
    checkpoints = []
    for length, floor, size in header:
        if offset + size > len(data):
            raise ValueError("truncated checkpoints file")
        checkpoints.append(Checkpoint(length, data[offset : offset + size], floor))
        offset += size
    return tuple(checkpoints)


def _checkpoint_spans(path: Path) -> tuple[tuple[int, int], ...]:
    """The (floor, length) spans in a checkpoints file's header (none when it is missing or
    unreadable: entries written before checkpoints were stored have none)."""
    try:
        with path.open("rb") as file:
            first = file.read(16)
            _, end, _ = _header_layout(first)
            header, _ = _read_header(first + file.read(max(0, end - len(first))))
    except (OSError, ValueError):
        return ()
    return tuple((floor, length) for length, floor, _ in header)


def _is_prefix(short: Sequence[int], long: Sequence[int]) -> bool:
    return len(short) <= len(long) and common_prefix(short, long) == len(short)


def _remove(stem: Path) -> None:
    """An entry's files, its index first."""
    for suffix in _SUFFIXES:
        _unlink(stem.with_suffix(suffix))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _unlink(path: Path) -> None:
    # The directory itself may be gone or unwritable: nothing to clean up there then.
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)
