"""Hostile files in a host-cache directory (issue 38's probe: a checkpoints file declaring
2^40 entries, a FIFO for a tokens file, a state linked to /dev/zero): the files of a good
entry, rewritten at random, never make the reader raise, hang or read past the file, and
what it restores stays within the conversation (a state's own bytes carry no checksum, so
a changed state is restored as it is; llama.cpp checks its sizes)."""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import strategies as st

from kronk_caching.host_store import Checkpoint, HostStore, StoredConversation
from kronk_testing.fuzzing import fuzz_settings

TOKENS = list(range(1000))
STATE = b"state" * 100
CHECKPOINTS = [Checkpoint(300, b"c" * 64, 280)]
SUFFIXES = (".tokens", ".state", ".checkpoints")
# 64-bit values that a header field may be rewritten with: counts and sizes past any file.
EXTREMES = st.sampled_from([0, 1, -1, 2**31, 2**40, 2**62, 2**63 - 1, -(2**63)])


def longest(entry: StoredConversation, shared: int) -> int:
    return shared


@st.composite
def damage(draw: st.DrawFn) -> tuple[str, Callable[[bytes], bytes]]:
    """Which of the entry's files, and what happens to its bytes."""
    suffix = draw(st.sampled_from(SUFFIXES))
    kind = draw(st.sampled_from(["cut", "overwrite", "field", "grow"]))
    at, value = draw(st.integers(0, 4096)), draw(EXTREMES)
    noise = draw(st.binary(min_size=1, max_size=64))

    def change(data: bytes) -> bytes:
        offset = at % (len(data) + 1)
        if kind == "cut":
            return data[:offset]
        if kind == "overwrite":
            return data[:offset] + noise + data[offset + len(noise) :]
        if kind == "field":  # an aligned 64-bit field set to an extreme
            offset -= offset % 8
            return data[:offset] + struct.pack("<q", value) + data[offset + 8 :]
        return data + noise * 1000

    return suffix, change


@pytest.mark.fuzz
def test_damaged_cache_files_are_read_as_written_or_skipped(
    tmp_path_factory: pytest.TempPathFactory, explore: Callable[[Callable[[], None]], None]
) -> None:
    @fuzz_settings(
        "host cache files",
        max_examples=200,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(damaged=damage())
    # The probe's checkpoints file: a count of 2^40 where the count stands.
    @example(damaged=(".checkpoints", lambda data: data[:8] + struct.pack("<q", 2**40) + data[16:]))
    def read(damaged: tuple[str, Callable[[bytes], bytes]]) -> None:
        suffix, change = damaged
        directory = tmp_path_factory.mktemp("cache")
        HostStore(max_bytes=0, directory=directory, fingerprint="f").put(
            TOKENS, STATE, floor=700, checkpoints=CHECKPOINTS
        )
        (file,) = (directory / "f").glob(f"*{suffix}")
        file.write_bytes(change(file.read_bytes()))
        outcome: list[tuple[bytes | None, tuple[Checkpoint, ...]]] = []

        def restore() -> None:
            store = HostStore(max_bytes=0, directory=directory, fingerprint="f")
            _, entry = store.best(TOKENS, longest)
            if entry is not None:
                outcome.append((store.state_of(entry), store.checkpoints_of(entry)))
            else:
                outcome.append((None, ()))

        reader = threading.Thread(target=restore, daemon=True)
        reader.start()
        reader.join(60)  # a reader that hangs is the failure
        assert not reader.is_alive(), "the reader hangs"
        assert outcome, "the reader raised"
        state, checkpoints = outcome[0]
        if suffix != ".state":
            assert state in (None, STATE)
        for checkpoint in checkpoints:
            assert 0 <= checkpoint.floor <= checkpoint.length <= len(TOKENS), checkpoint

    explore(read)
