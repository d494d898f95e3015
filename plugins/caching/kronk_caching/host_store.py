"""The host-memory tier: sequence states of evicted conversations, in RAM and optionally on disk.

Bounded by bytes (LRU). On disk, entries live under a fingerprint of the
model file and the KV-shaping config, so a different model or layout never
restores a wrong state. The disk is an addition, never a condition: when its
directory cannot be written (gone, read-only, full), conversations are kept in
RAM only and a warning is logged; no request fails for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kronk_caching.prefix import token_key
from kronk_core.tokens import common_prefix

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The untrimmable part of a sequence's state (sliding-window cells, recurrent state)
    when it held `length` tokens: what cuts it back below its trim floor."""

    length: int
    state: bytes


@dataclass(slots=True)
class StoredConversation:
    tokens: tuple[int, ...]
    state: bytes | None  # None: only on disk
    file: Path | None
    # The state, once restored, can be cut back to this length and no shorter
    # (TextModel.trim_floor when it was saved)...
    floor: int = 0
    # ...or to one of these lengths, through the checkpoint taken there (ascending).
    checkpoint_lengths: tuple[int, ...] = ()
    checkpoints: tuple[Checkpoint, ...] | None = ()  # None: only on disk

    @property
    def ram_bytes(self) -> int:
        held = len(self.state) if self.state is not None else 0
        return held + sum(len(c.state) for c in self.checkpoints or ())

    def keeps(self, length: int) -> bool:
        """Whether the state can be cut back to exactly `length` tokens."""
        return length >= min(self.floor, len(self.tokens)) or length in self.checkpoint_lengths


class HostStore:
    def __init__(
        self, *, max_bytes: int, directory: Path | None, fingerprint: str, shared: bool = False
    ) -> None:
        self._max_bytes = max_bytes
        # Shared with other servers: their entries are picked up when the directory changes.
        self._shared = shared
        self._scanned_at = 0
        self._entries: OrderedDict[bytes, StoredConversation] = OrderedDict()
        self._bytes = 0
        self._directory = directory / fingerprint if directory is not None else None
        # Whether the last disk write failed (its warning is logged once until one succeeds).
        self._disk_failing = False
        if self._directory is not None:
            try:
                self._directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                self._disk_failed(exc)
            else:
                self._load_index()

    @property
    def ram_bytes(self) -> int:
        return self._bytes

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

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
            tuple(tokens), state, None, floor, tuple(c.length for c in ordered), ordered
        )
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
        self._shrink()

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
        if not best_keep:
            return 0, None
        self._entries.move_to_end(best_key)
        return best_keep, self._entries[best_key]

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
            if entry.file is not None:
                entry.state = entry.checkpoints = None  # still on disk
            else:
                del self._entries[key]

    def _drop(self, key: bytes, *, unlink: bool = True) -> None:
        entry = self._entries.pop(key)
        self._bytes -= entry.ram_bytes
        if unlink and entry.file is not None:
            for suffix in (".tokens", ".checkpoints", ".state"):
                _unlink(entry.file.with_suffix(suffix))

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
                del self._entries[key]
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
                lengths = _checkpoint_lengths(file.with_suffix(".checkpoints"))
                self._entries[token_key(tokens)] = StoredConversation(
                    tokens, None, file, floor, lengths, None
                )
        if self._entries:
            log.info(
                "host cache: %d conversations on disk in %s", len(self._entries), self._directory
            )


# A checkpoints file: their count, each one's length and size (int64), then their states.
def _pack_checkpoints(checkpoints: Sequence[Checkpoint]) -> bytes:
    header = [len(checkpoints)] + [n for c in checkpoints for n in (c.length, len(c.state))]
    return np.asarray(header, dtype=np.int64).tobytes() + b"".join(c.state for c in checkpoints)


def _read_header(data: bytes) -> tuple[list[tuple[int, int]], int]:
    """(length, size) of each checkpoint, and where their states start."""
    if len(data) < 8:
        raise ValueError("truncated checkpoints file")
    count = int(np.frombuffer(data[:8], dtype=np.int64)[0])
    end = 8 + 16 * count
    if count < 0 or len(data) < end:
        raise ValueError("truncated checkpoints file")
    pairs = np.frombuffer(data[8:end], dtype=np.int64).reshape(count, 2)
    return [(int(length), int(size)) for length, size in pairs], end


def _unpack_checkpoints(data: bytes) -> tuple[Checkpoint, ...]:
    header, offset = _read_header(data)
    checkpoints = []
    for length, size in header:
        if offset + size > len(data):
            raise ValueError("truncated checkpoints file")
        checkpoints.append(Checkpoint(length, data[offset : offset + size]))
        offset += size
    return tuple(checkpoints)


def _checkpoint_lengths(path: Path) -> tuple[int, ...]:
    """The lengths in a checkpoints file's header (none when it is missing or unreadable:
    entries written before checkpoints were stored have none)."""
    try:
        with path.open("rb") as file:
            count = file.read(8)
            size = 16 * int(np.frombuffer(count, dtype=np.int64)[0]) if len(count) == 8 else 0
            header, _ = _read_header(count + file.read(size))
    except (OSError, ValueError):
        return ()
    return tuple(length for length, _ in header)


def _is_prefix(short: Sequence[int], long: Sequence[int]) -> bool:
    return len(short) <= len(long) and common_prefix(short, long) == len(short)


def _unlink(path: Path) -> None:
    # The directory itself may be gone or unwritable: nothing to clean up there then.
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)
