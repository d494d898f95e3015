"""The host tier on a real model, with hostile files in its shared directory: requests are
served, conversations restored, and the engine never waits on a FIFO."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from kronk_core import Kronk, LoadedModel
from kronk_core.contract.types import ChatResult
from kronk_testing.conversations import AGENT_SYSTEMS, ask, continued, conversation, fresh

# Each request's limit: a healthy one takes seconds; past this, the engine is taken as hung.
ANSWER_SECONDS = 300
HUGE_CHECKPOINTS = np.asarray([-2, 1 << 40], dtype=np.int64).tobytes()


def plant(directory: Path) -> list[Path]:
    """Hostile files beside the entries in `directory`: a FIFO and a directory as tokens
    files, an entry whose state links to /dev/zero (its tokens an entry's), and checkpoints
    files declaring 2^40 checkpoints in place of the entries' own. The FIFOs, for the test
    to unblock whatever waits on one."""
    entries = [path.with_suffix("") for path in directory.glob("*.tokens") if path.is_file()]
    fifo = directory / ("a" * 64 + ".tokens")
    os.mkfifo(fifo)
    (directory / ("b" * 64 + ".tokens")).mkdir()
    zero = directory / ("c" * 64)
    zero.with_suffix(".tokens").write_bytes(entries[0].with_suffix(".tokens").read_bytes())
    zero.with_suffix(".state").symlink_to("/dev/zero")
    declare_huge_checkpoints(directory)
    return [fifo]


def declare_huge_checkpoints(directory: Path) -> None:
    """Every entry's checkpoints file declares 2^40 checkpoints."""
    for tokens in directory.glob("*.tokens"):
        if tokens.is_file() and tokens.with_suffix(".state").is_file():
            tokens.with_suffix(".checkpoints").write_bytes(HUGE_CHECKPOINTS)


def unblock(fifos: list[Path]) -> None:
    for fifo in fifos:
        with contextlib.suppress(OSError):  # no reader waits on it
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


async def answered(kronk: Kronk, messages: list[dict[str, str]]) -> ChatResult:
    return await asyncio.wait_for(ask(kronk, "m", messages), ANSWER_SECONDS)


async def test_hostile_files_in_a_shared_directory_fail_no_request(
    gemma_path: str, tmp_path: Path
) -> None:
    """One slot, a shared directory (written after every request, looked at again before
    each restore). With a FIFO and a directory named as tokens files, a state linked to
    /dev/zero and a checkpoints file declaring 2^40 entries planted there: every request
    is answered, the conversation comes back from the disk, and so it does after a restart
    (whose load reads the directory)."""
    disk = tmp_path / "kv"
    settings: dict[str, Any] = {
        "caching": {"host_cache_dir": disk, "host_cache_bytes": 0, "host_cache_shared": True},
        "n_seq_max": 1,
    }
    fifos: list[Path] = []
    kronk = fresh(gemma_path, tmp_path, **settings)
    try:
        first_turn = conversation(AGENT_SYSTEMS[0], 1)
        first = await answered(kronk, first_turn)
        other = await answered(kronk, conversation(AGENT_SYSTEMS[1], 1))  # takes the slot
        assert other.usage.completion_tokens > 0
        (directory,) = disk.iterdir()  # the model's fingerprint directory
        fifos = plant(directory)
        back = await answered(kronk, continued(first_turn, first))
        assert back.usage.cached_tokens > 100  # restored from the disk
        loaded = kronk.get_loaded("m")
        assert isinstance(loaded, LoadedModel)
        assert loaded.engine.cache_counters().restores == 1
    finally:
        unblock(fifos)
        kronk.close()
    declare_huge_checkpoints(directory)  # the entries written since, too
    restarted = fresh(gemma_path, tmp_path, **settings)
    try:
        again = await answered(restarted, continued(first_turn, first))
        assert again.usage.cached_tokens > 100
    finally:
        unblock(fifos)
        restarted.close()
