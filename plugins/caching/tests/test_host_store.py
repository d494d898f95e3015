"""The host tier's store on its own: its budget, which entries it keeps, and its disk format."""

from __future__ import annotations

from pathlib import Path

import pytest

from kronk_caching.host_store import Checkpoint, HostStore, StoredConversation
from kronk_caching.plugin import incremental_cache
from kronk_core import ModelConfig
from kronk_core.backend import ModelInfo
from kronk_core.memory import available_ram

INFO = ModelInfo(
    id="m", path="m.gguf", architecture="gemma3", n_ctx_train=32768, n_ctx_per_seq=4096,
    n_seq_max=2, n_vocab=262144, bos_token="<bos>", eos_token="<eos>", chat_template=None,
    kv_trimmable=False, n_swa=512,
)  # fmt: skip


def strategy_store(path: Path, caching: dict[str, object]) -> HostStore | None:
    path.touch()
    config = ModelConfig.model_validate({"model_path": path, "caching": caching})
    store: HostStore | None = incremental_cache(model_config=config, model_info=INFO).store
    return store


def test_the_default_budget_follows_the_memory_there_is(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    before = available_ram()
    store = strategy_store(model, {})
    after = available_ram()
    assert store is not None and before is not None and after is not None
    low, high = sorted((before, after))
    assert min(low // 4, 8 << 30) * 0.9 <= store.max_bytes <= min(high // 4, 8 << 30) * 1.1
    assert strategy_store(model, {"host_cache_bytes": 0}) is None
    explicit = strategy_store(model, {"host_cache_bytes": 12345})
    assert explicit is not None and explicit.max_bytes == 12345


def longest(entry: StoredConversation, shared: int) -> int:
    return shared


def test_a_shorter_branch_stays_where_the_longer_cannot_be_cut_back_to_it(
    tmp_path: Path,
) -> None:
    store = HostStore(max_bytes=1 << 20, directory=None, fingerprint="f")
    store.put(range(100), b"s" * 10, floor=0)
    store.put(range(300), b"l" * 10, floor=200)  # cannot be cut back to 100 tokens
    assert len(store) == 2
    store.put(range(400), b"x" * 10, floor=50)  # can: the two it extends go
    assert len(store) == 1
    store.put(range(500), b"y" * 10, floor=450, checkpoints=[Checkpoint(400, b"c")])
    assert len(store) == 1  # the checkpoint cuts it back to exactly 400 tokens


@pytest.mark.parametrize("in_ram", [True, False])
def test_checkpoints_come_back_from_ram_and_after_a_restart(tmp_path: Path, in_ram: bool) -> None:
    checkpoints = [Checkpoint(300, b"second" * 3), Checkpoint(120, b"first")]
    store = HostStore(max_bytes=1 << 20 if in_ram else 0, directory=tmp_path, fingerprint="f")
    store.put(range(1000), b"state", floor=700, checkpoints=checkpoints)
    if not in_ram:  # over budget: only on disk, read back by a new store (a restart)
        store = HostStore(max_bytes=0, directory=tmp_path, fingerprint="f")
    assert store.ram_bytes == (len(b"state") + 5 + 18 if in_ram else 0)
    keep, entry = store.best([*range(500), 7, 7], longest)
    assert entry is not None and keep == 500
    assert entry.checkpoint_lengths == (120, 300) and entry.floor == 700
    first, second = Checkpoint(120, b"first"), Checkpoint(300, b"second" * 3)
    assert store.checkpoints_of(entry) == (first, second)
    assert store.state_of(entry) == b"state"
    assert entry.keeps(300) and entry.keeps(700) and not entry.keeps(299)


def test_a_truncated_checkpoints_file_leaves_the_entry_without_checkpoints(
    tmp_path: Path,
) -> None:
    store = HostStore(max_bytes=0, directory=tmp_path, fingerprint="f")
    store.put(range(1000), b"state", floor=700, checkpoints=[Checkpoint(300, b"c" * 64)])
    (file,) = (tmp_path / "f").glob("*.checkpoints")
    file.write_bytes(file.read_bytes()[:-10])
    restarted = HostStore(max_bytes=0, directory=tmp_path, fingerprint="f")
    _, entry = restarted.best(range(1000), longest)
    assert entry is not None and entry.checkpoint_lengths == (300,)
    assert restarted.checkpoints_of(entry) == ()  # unreadable: no cut below the floor
