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
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kronk_caching.prefix import token_key
from kronk_core.tokens import common_prefix

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StoredConversation:
    tokens: tuple[int, ...]
    state: bytes | None  # None: only on disk
    file: Path | None
    # The state, once restored, can be cut back to this length and no shorter
    # (TextModel.trim_floor when it was saved).
    floor: int = 0


class HostStore:
    def __init__(self, *, max_bytes: int, directory: Path | None, fingerprint: str) -> None:
        self._max_bytes = max_bytes
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

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, tokens: Sequence[int], state: bytes, floor: int = 0) -> None:
        """Keep this conversation's state; drop stored conversations it extends."""
        key = token_key(tokens)
        for other in [k for k, e in self._entries.items() if _is_prefix(e.tokens, tokens)]:
            self._drop(other)
        file = None
        if self._directory is not None:
            file = self._write(
                self._directory / hashlib.sha256(key).hexdigest(), tokens, state, floor
            )
        self._entries[key] = StoredConversation(tuple(tokens), state, file, floor)
        self._bytes += len(state)
        self._shrink()

    def _write(self, file: Path, tokens: Sequence[int], state: bytes, floor: int) -> Path | None:
        """Write an entry's files; None (and nothing on disk) when the disk refuses.

        Each file is written aside and renamed into place, the tokens file (the
        index) last, so a write cut short never leaves an entry that looks whole.
        """
        state_file, tokens_file = file.with_suffix(".state"), file.with_suffix(".tokens")
        partial = [file.with_suffix(".state.partial"), file.with_suffix(".tokens.partial")]
        try:
            file.parent.mkdir(parents=True, exist_ok=True)  # back, if it was removed
            partial[0].write_bytes(state)
            partial[0].replace(state_file)
            # The floor first, then the tokens.
            np.asarray([floor, *tokens], dtype=np.int32).tofile(partial[1])
            partial[1].replace(tokens_file)
        except OSError as exc:
            self._disk_failed(exc)
            for path in (*partial, state_file, tokens_file):
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

    def best(self, prompt: Sequence[int], *, at_least: int) -> tuple[int, StoredConversation]:
        """The entry sharing the longest prefix (≥ at_least) with prompt, or (0, empty)."""
        best_len, best_key = 0, b""
        for key, entry in self._entries.items():
            shared = common_prefix(entry.tokens, prompt)
            if shared >= at_least and shared > best_len:
                best_len, best_key = shared, key
        if not best_len:
            return 0, StoredConversation((), None, None)
        self._entries.move_to_end(best_key)
        return best_len, self._entries[best_key]

    def state_of(self, entry: StoredConversation) -> bytes | None:
        if entry.state is not None:
            return entry.state
        if entry.file is None:
            return None
        try:
            return entry.file.with_suffix(".state").read_bytes()
        except OSError:
            return None

    def _shrink(self) -> None:
        """Evict RAM copies, least recently used first, until under budget."""
        for key, entry in list(self._entries.items()):
            if self._bytes <= self._max_bytes:
                return
            if entry.state is None:
                continue
            self._bytes -= len(entry.state)
            if entry.file is not None:
                entry.state = None  # still on disk
            else:
                del self._entries[key]

    def _drop(self, key: bytes) -> None:
        entry = self._entries.pop(key)
        if entry.state is not None:
            self._bytes -= len(entry.state)
        if entry.file is not None:
            _unlink(entry.file.with_suffix(".tokens"))
            _unlink(entry.file.with_suffix(".state"))

    def _load_index(self) -> None:
        assert self._directory is not None
        for tokens_file in sorted(self._directory.glob("*.tokens")):
            try:
                floor, *rest = (int(t) for t in np.fromfile(tokens_file, dtype=np.int32))
            except (OSError, ValueError):
                log.warning("host cache: skipping unreadable entry %s", tokens_file)
                continue
            tokens = tuple(rest)
            file = tokens_file.with_suffix("")
            if file.with_suffix(".state").exists():
                self._entries[token_key(tokens)] = StoredConversation(tokens, None, file, floor)
        if self._entries:
            log.info(
                "host cache: %d conversations on disk in %s", len(self._entries), self._directory
            )


def _is_prefix(short: Sequence[int], long: Sequence[int]) -> bool:
    return len(short) <= len(long) and common_prefix(short, long) == len(short)


def _unlink(path: Path) -> None:
    # The directory itself may be gone or unwritable: nothing to clean up there then.
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)
