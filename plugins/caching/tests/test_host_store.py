"""The host tier's store on its own: its budget, which entries it keeps, and its disk format."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from kronk_caching.disk import DiskCalls, DiskTimeout
from kronk_caching.eviction import Placement, place
from kronk_caching.host_store import LEFTOVER_SECONDS, Checkpoint, HostStore, StoredConversation
from kronk_caching.plugin import incremental_cache
from kronk_core import ModelConfig
from kronk_core.contract.backend import ModelInfo
from kronk_core.contract.memory import available_ram
from kronk_testing.waiting import reached

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
    store.put(range(500), b"y" * 10, floor=450, checkpoints=[Checkpoint(400, b"c", 400)])
    assert len(store) == 1  # the checkpoint cuts it back to exactly 400 tokens


@pytest.mark.parametrize("in_ram", [True, False])
def test_checkpoints_come_back_from_ram_and_after_a_restart(tmp_path: Path, in_ram: bool) -> None:
    checkpoints = [Checkpoint(300, b"second" * 3, 250), Checkpoint(120, b"first", 120)]
    store = HostStore(max_bytes=1 << 20 if in_ram else 0, directory=tmp_path, fingerprint="f")
    store.put(range(1000), b"state", floor=700, checkpoints=checkpoints)
    if not in_ram:  # over budget: only on disk, read back by a new store (a restart)
        store = HostStore(max_bytes=0, directory=tmp_path, fingerprint="f")
    assert store.ram_bytes == (len(b"state") + 5 + 18 if in_ram else 0)
    keep, entry = store.best([*range(500), 7, 7], longest)
    assert entry is not None and keep == 500
    assert entry.checkpoint_spans == ((120, 120), (250, 300)) and entry.floor == 700
    first, second = Checkpoint(120, b"first", 120), Checkpoint(300, b"second" * 3, 250)
    assert store.checkpoints_of(entry) == (first, second)
    assert store.state_of(entry) == b"state"
    # The second checkpoint reaches back to its floor, the first only to its own length.
    assert entry.keeps(300) and entry.keeps(250) and entry.keeps(120) and entry.keeps(700)
    assert not entry.keeps(249) and not entry.keeps(121) and not entry.keeps(301)


def test_a_truncated_checkpoints_file_leaves_the_entry_without_checkpoints(
    tmp_path: Path,
) -> None:
    store = HostStore(max_bytes=0, directory=tmp_path, fingerprint="f")
    store.put(range(1000), b"state", floor=700, checkpoints=[Checkpoint(300, b"c" * 64, 280)])
    (file,) = (tmp_path / "f").glob("*.checkpoints")
    file.write_bytes(file.read_bytes()[:-10])
    restarted = HostStore(max_bytes=0, directory=tmp_path, fingerprint="f")
    _, entry = restarted.best(range(1000), longest)
    # Its header declares more than the file holds: no cut below the floor.
    assert entry is not None and entry.checkpoint_spans == ()
    assert restarted.checkpoints_of(entry) == () and restarted.state_of(entry) == b"state"


def test_a_conversation_stored_again_keeps_its_files_on_disk(tmp_path: Path) -> None:
    """The same tokens stored twice (written through after each request) replace the
    entry's files; a longer turn of it replaces them in turn."""
    store = HostStore(max_bytes=0, directory=tmp_path, fingerprint="f")
    store.put(range(100), b"a" * 10)
    store.put(range(100), b"b" * 10)
    restarted = HostStore(max_bytes=0, directory=tmp_path, fingerprint="f")
    keep, entry = restarted.best(range(120), longest)
    assert keep == 100 and entry is not None and restarted.state_of(entry) == b"b" * 10
    store.put(range(150), b"c" * 10)
    assert sorted(path.suffix for path in (tmp_path / "f").iterdir()) == [
        ".checkpoints", ".state", ".tokens"
    ]  # fmt: skip
    restarted = HostStore(max_bytes=0, directory=tmp_path, fingerprint="f")
    keep, entry = restarted.best(range(160), longest)
    assert keep == 150 and entry is not None and restarted.state_of(entry) == b"c" * 10


# Stores a conversation, then dies by SIGKILL halfway through writing the state of the
# next turn of it, which supersedes it.
KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from kronk_caching.host_store import HostStore

store = HostStore(max_bytes=0, directory=Path(sys.argv[1]), fingerprint="f")
store.put(range(100), b"a" * 10)

def dying(path, data):
    with path.open("wb") as file:
        file.write(data[: len(data) // 2])
    os.kill(os.getpid(), signal.SIGKILL)

Path.write_bytes = dying
store.put(range(150), b"b" * 10)
"""


def test_a_process_killed_writing_a_newer_turn_leaves_the_previous_one(tmp_path: Path) -> None:
    """The newer turn is written before the entry it supersedes goes: `kill -9` in the
    middle leaves the previous turn on disk for the next start."""
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], timeout=120)
    assert killed.returncode == -signal.SIGKILL
    assert len(list((tmp_path / "f").glob("*.state.*.partial"))) == 1
    restarted = HostStore(max_bytes=0, directory=tmp_path, fingerprint="f")
    keep, entry = restarted.best(range(160), longest)
    assert keep == 100 and entry is not None and restarted.state_of(entry) == b"a" * 10


def test_servers_sharing_a_directory_see_each_others_conversations(tmp_path: Path) -> None:
    """host_cache_shared: an entry one server writes is restorable by another that started
    before it; one it drops is forgotten by the other."""
    writer = HostStore(max_bytes=1 << 20, directory=tmp_path, fingerprint="f", shared=True)
    reader = HostStore(max_bytes=1 << 20, directory=tmp_path, fingerprint="f", shared=True)
    writer.put(range(100), b"a" * 10)
    keep, entry = reader.best(list(range(120)), longest)
    assert keep == 100 and entry is not None and entry.state is None  # on disk only
    assert reader.state_of(entry) == b"a" * 10
    writer.put(range(200), b"b" * 10)  # extends the first, whose files go
    keep, entry = reader.best(list(range(250)), longest)
    assert keep == 200 and entry is not None and reader.state_of(entry) == b"b" * 10
    assert len(reader) == 1
    # A store that does not share reads the directory at start only.
    alone = HostStore(max_bytes=1 << 20, directory=tmp_path, fingerprint="f")
    writer.put(range(300), b"c" * 10)
    assert alone.best(list(range(350)), longest)[0] == 200


def test_two_writers_of_one_conversation_never_leave_half_an_entry(tmp_path: Path) -> None:
    """Each writer writes its own partial files and renames each into place: whichever
    rename lands last, the state file is one writer's whole state, and no partial file
    is left behind."""
    size = 1 << 20

    def write(marker: int) -> None:
        store = HostStore(max_bytes=1 << 30, directory=tmp_path, fingerprint="f", shared=True)
        for _ in range(10):
            store.put(range(150), bytes([marker]) * size)

    writers = [threading.Thread(target=write, args=(marker,)) for marker in (1, 2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    reader = HostStore(max_bytes=0, directory=tmp_path, fingerprint="f")
    keep, entry = reader.best(list(range(160)), longest)
    assert keep == 150 and entry is not None
    state = reader.state_of(entry)
    assert state in (bytes([1]) * size, bytes([2]) * size)
    assert not list(tmp_path.rglob("*.partial"))


def age(directory: Path, tokens: range, seconds: float) -> None:
    """Make the entry of `tokens` look last written `seconds` ago."""
    (tokens_file,) = [
        path
        for path in directory.rglob("*.tokens")
        if tuple(np.fromfile(path, dtype=np.int32)[1:]) == tuple(tokens)
    ]
    then = time.time() - seconds
    for path in tokens_file.parent.glob(tokens_file.stem + ".*"):
        os.utime(path, (then, then))


def on_disk(directory: Path) -> int:
    return len(list(directory.rglob("*.tokens")))


def test_a_shared_directory_forgets_what_is_past_its_age_or_size(tmp_path: Path) -> None:
    """Any server sharing the directory removes entries past its bounds, the others'
    included; a server that held a removed entry in RAM keeps it there, one that only knew
    it on disk forgets it."""
    shared = {"directory": tmp_path, "fingerprint": "f", "shared": True, "expire_every": 0.0}
    old = HostStore(max_bytes=1 << 20, **shared)  # bounds off: it writes, never removes
    old.put(range(100), b"a" * 1000)
    old.put(range(1000, 1100), b"b" * 1000)
    age(tmp_path, range(100), 3 * 3600)
    reader = HostStore(max_bytes=0, **shared)
    assert len(reader) == 2
    bounded = HostStore(max_bytes=1 << 20, disk_max_age=3600, **shared)  # removes at start
    assert on_disk(tmp_path) == 1 and len(bounded) == 1
    assert reader.best(list(range(120)), longest) == (0, None)  # gone from the disk: forgotten
    keep, entry = old.best(list(range(120)), longest)  # still in the writer's RAM
    assert keep == 100 and entry is not None and old.state_of(entry) == b"a" * 1000

    # Past 3 entries' bytes, the least recently written go first, whoever wrote them.
    size = sum(path.stat().st_size for path in tmp_path.rglob("*") if path.is_file())
    sized = HostStore(max_bytes=1 << 20, disk_max_bytes=3 * size, **shared)
    for start in range(2000, 6000, 1000):
        old.put(range(start, start + 100), b"c" * 1000)
        age(tmp_path, range(start, start + 100), (6000 - start) / 100)
    age(tmp_path, range(1000, 1100), 3600)  # the oldest of all
    sized.put(range(9000, 9100), b"d" * 1000)
    left = {tuple(np.fromfile(p, dtype=np.int32)[1:3]) for p in tmp_path.rglob("*.tokens")}
    assert left == {(4000, 4001), (5000, 5001), (9000, 9001)}


def test_leftovers_of_a_dead_writer_go_and_a_fresh_write_stays(tmp_path: Path) -> None:
    store = HostStore(max_bytes=0, directory=tmp_path, fingerprint="f", disk_max_age=3600)
    store.put(range(100), b"a" * 100)
    folder = tmp_path / "f"
    dead = [folder / "abc.state.1-aa.partial", folder / "abc.state", folder / "abc.checkpoints"]
    for path in dead:
        path.write_bytes(b"x")
    fresh = folder / "def.state.2-bb.partial"  # a writer at work now
    fresh.write_bytes(b"x")
    then = time.time() - LEFTOVER_SECONDS - 60
    for path in dead:
        os.utime(path, (then, then))
    store.expire()
    assert not any(path.exists() for path in dead)
    assert fresh.exists() and on_disk(tmp_path) == 1


def test_readers_never_see_half_an_entry_while_another_server_removes(tmp_path: Path) -> None:
    """One server writes conversations into a shared directory with a tight size bound, so
    it removes entries all the time; another keeps picking them up and reading them. Every
    state it reads is whole: its entry's own bytes, or nothing (then it would rebuild)."""
    size = 256 << 10
    bounded = {"directory": tmp_path, "fingerprint": "f", "shared": True, "expire_every": 0.0}
    stop = threading.Event()
    seen: list[int] = []
    wrong: list[str] = []

    def read() -> None:
        reader = HostStore(max_bytes=0, **bounded)
        while not stop.is_set():
            for marker in range(1, 40):
                prompt = [marker * 1000 + t for t in range(110)]
                _, entry = reader.best(prompt, longest)
                if entry is None:
                    continue
                state = reader.state_of(entry)
                if state is not None and state != bytes([entry.tokens[0] // 1000]) * size:
                    wrong.append(f"{entry.tokens[0]}: {len(state)} bytes")
                seen.append(state is not None)

    reader = threading.Thread(target=read)
    reader.start()
    writer = HostStore(max_bytes=0, disk_max_bytes=3 * size, **bounded)
    try:
        for _ in range(5):
            for marker in range(1, 40):
                writer.put(range(marker * 1000, marker * 1000 + 100), bytes([marker]) * size)
    finally:
        stop.set()
        reader.join()
    assert not wrong
    assert any(seen)  # it did read entries while they were being removed
    assert on_disk(tmp_path) <= 3


def test_a_checkpoints_file_written_before_floors_reaches_only_its_lengths(
    tmp_path: Path,
) -> None:
    """Files of the earlier format (count, then length and size per checkpoint) still load:
    each checkpoint cuts back to exactly its own length, as it did then."""
    store = HostStore(max_bytes=0, directory=tmp_path, fingerprint="f")
    store.put(range(1000), b"state", floor=700, checkpoints=[Checkpoint(300, b"c" * 64, 280)])
    (file,) = (tmp_path / "f").glob("*.checkpoints")
    file.write_bytes(np.asarray([1, 300, 64], dtype=np.int64).tobytes() + b"c" * 64)
    restarted = HostStore(max_bytes=0, directory=tmp_path, fingerprint="f")
    _, entry = restarted.best(range(1000), longest)
    assert entry is not None and entry.checkpoint_spans == ((300, 300),)
    assert restarted.checkpoints_of(entry) == (Checkpoint(300, b"c" * 64, 300),)


# ---- which conversations stay when they do not all fit ----------------------------------


def restores(store: HostStore, visits: list[int]) -> int:
    """Conversations visited in this order, each visit a turn: the prompt is the
    conversation so far plus ten tokens; then the answer's five tokens follow and the
    conversation is stored (100 bytes). How many turns found their whole conversation."""
    conversations: dict[int, list[int]] = {}
    found = 0
    for visit in visits:
        conversation = conversations.get(visit, [1000 + visit])
        prompt = [*conversation, *[7] * 10]
        keep, _ = store.best(prompt, longest)
        found += visit in conversations and keep >= len(conversation)
        conversations[visit] = [*prompt, *[8] * 5]
        store.put(conversations[visit], b"x" * 100)
    return found


def agents_in_turn(agents: int, rounds: int) -> list[int]:
    return [agent for _ in range(rounds) for agent in range(agents)]


def chats_of_a_person(steps: int) -> list[int]:
    """A new chat every ten steps; otherwise back to the newest or one of the two before."""
    rng, newest, visits = random.Random(1), 0, []
    for step in range(steps):
        newest += step % 10 == 0
        visits.append(newest if step % 10 == 0 else max(1, newest - rng.choice([0, 0, 1, 2])))
    return visits


def test_agents_taking_turns_beyond_the_tier_keep_a_steady_share_restored() -> None:
    """Eight agents in a cycle, a tier holding three conversations: the least recently
    used is always the next one back, so that alone restores nothing; the tier keeps
    three of them instead, restored every round after the first."""
    store = HostStore(max_bytes=350, directory=None, fingerprint="f")
    assert restores(store, agents_in_turn(8, 12)) == 3 * 11
    assert store.placement is Placement.keep


def test_a_person_going_back_to_recent_chats_keeps_the_least_recently_used_order() -> None:
    """Back to the chat before each new one, and a person's drift over their newest chats:
    the tier restores what the least recently used order does (keeping what it holds would
    restore a third of that)."""
    back = [visit for chat in range(30) for visit in ([chat, chat - 1] if chat else [chat])]
    for visits, expected in ((back, 29), (chats_of_a_person(200), 166)):
        store = HostStore(max_bytes=350, directory=None, fingerprint="f")
        assert restores(store, visits) == expected
        assert store.placement is Placement.recent


def test_the_tier_follows_its_traffic_from_a_fleet_to_a_person() -> None:
    """Eight agents in turn, then a person's chats on the same tier: it keeps what it holds
    while the fleet runs, and goes back to the least recently used order for the person
    (166 restores alone, 29 keeping what the fleet left)."""
    store = HostStore(max_bytes=350, directory=None, fingerprint="f")
    assert restores(store, agents_in_turn(8, 12)) == 33
    assert store.placement is Placement.keep
    assert restores(store, [100 + chat for chat in chats_of_a_person(200)]) >= 160
    assert store.placement is Placement.recent


def test_keeping_puts_a_continuation_last_in_line_and_a_new_conversation_first() -> None:
    """Under `keep`, a conversation that goes on with a restored one (which it superseded,
    so no longer held) leaves last; a new one first; an older version still held first."""
    order: OrderedDict[bytes, None] = OrderedDict.fromkeys([b"a", b"b", b"next"])
    place(Placement.keep, order, b"next", extends=[b"gone"], churn=False)
    assert list(order) == [b"a", b"b", b"next"]
    order[b"new"] = None
    place(Placement.keep, order, b"new", extends=[], churn=False)
    assert list(order) == [b"new", b"a", b"b", b"next"]
    order[b"b2"] = None
    place(Placement.keep, order, b"b2", extends=[b"b"], churn=False)
    assert list(order) == [b"b", b"new", b"a", b"next", b"b2"]


# ---- what the reader refuses in the directory ---------------------------------------


def stem_of(directory: Path, first_token: int) -> Path:
    """The files' stem of the entry whose tokens start with `first_token`."""
    (tokens_file,) = [
        path
        for path in directory.glob("*.tokens")
        if path.is_file() and int(np.fromfile(path, dtype=np.int32)[1]) == first_token
    ]
    return tokens_file.with_suffix("")


def skipped(caplog: pytest.LogCaptureFixture) -> dict[str, list[str]]:
    """File name → the reasons the store's warnings gave for skipping it."""
    found: dict[str, list[str]] = {}
    for record in caplog.records:
        message = record.getMessage()
        if record.levelno == logging.WARNING and message.startswith("host cache: skipping "):
            path, _, why = message.removeprefix("host cache: skipping ").partition(": ")
            found.setdefault(Path(path).name, []).append(why)
    return found


def unblock(fifo: Path) -> None:
    """Let a reader blocked on opening `fifo` go on (its writer opens and closes it)."""
    with contextlib.suppress(OSError):  # no reader: nothing to unblock
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def in_thread(run: Callable[[], None], fifos: Sequence[Path]) -> None:
    """Run `run` on a thread; fail, rather than hang, where it blocks on the file system
    (a FIFO's open waits for a writer): the test's failure detector."""
    failure: list[BaseException] = []

    def guarded() -> None:
        try:
            run()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=guarded, daemon=True)
    thread.start()
    thread.join(60)
    blocked = thread.is_alive()
    for fifo in fifos:
        unblock(fifo)
    thread.join(60)
    assert not blocked, "the store blocked on a file in its directory"
    if failure:
        raise failure[0]


HUGE_CHECKPOINTS = np.asarray([-2, 1 << 40], dtype=np.int64).tobytes()


def test_hostile_files_are_skipped_and_the_good_entries_beside_them_restore(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Entries written whole, then damaged as a shared directory, a disk fault or an older
    version can leave them: each is skipped with one warning naming its file and why; the
    one whose checkpoints file declares 2^40 checkpoints keeps its state without them; the
    good entry restores; nothing blocks on the FIFO."""
    folder = tmp_path / "f"
    writer = HostStore(max_bytes=0, directory=tmp_path, fingerprint="f")
    names = ("good", "huge", "short", "fifo", "zero", "directory")
    for index, _ in enumerate(names):
        start = 1000 * (index + 1)
        writer.put(range(start, start + 100), bytes([index + 1]) * 64, floor=90,
                   checkpoints=[Checkpoint(60, b"c" * 16, 50)])  # fmt: skip
    stems = {name: stem_of(folder, 1000 * (index + 1)) for index, name in enumerate(names)}
    stems["huge"].with_suffix(".checkpoints").write_bytes(HUGE_CHECKPOINTS)
    short = stems["short"].with_suffix(".tokens")
    short.write_bytes(short.read_bytes()[:-2])  # cut short, mid-token
    fifo = stems["fifo"].with_suffix(".tokens")
    fifo.unlink()
    os.mkfifo(fifo)
    stems["zero"].with_suffix(".state").unlink()
    stems["zero"].with_suffix(".state").symlink_to("/dev/zero")
    stems["directory"].with_suffix(".tokens").unlink()
    stems["directory"].with_suffix(".tokens").mkdir()
    stores: list[HostStore] = []

    def restart() -> None:
        with caplog.at_level(logging.WARNING, logger="kronk_caching.host_store"):
            store = HostStore(max_bytes=0, directory=tmp_path, fingerprint="f", shared=True)
            stores.append(store)
            for index, _ in enumerate(names):
                start = 1000 * (index + 1)
                store.best(range(start, start + 120), longest)
            # Other servers write on: every change of the directory is looked at again.
            writer.put(range(9000, 9100), b"x" * 64)
            store.best(range(9000, 9120), longest)

    in_thread(restart, [fifo])
    (store,) = stores
    assert skipped(caplog) == {
        fifo.name: ["a FIFO"],
        short.name: ["402 bytes: not a floor and whole 32-bit tokens"],
        stems["zero"].with_suffix(".state").name: ["a symbolic link"],
        stems["directory"].with_suffix(".tokens").name: ["a directory"],
        stems["huge"].with_suffix(".checkpoints").name: [
            "it declares 1099511627776 checkpoints, more than its 16 bytes can hold"
        ],
    }
    keep, good = store.best(range(1000, 1120), longest)
    assert keep == 100 and good is not None and store.state_of(good) == bytes([1]) * 64
    assert store.checkpoints_of(good) == (Checkpoint(60, b"c" * 16, 50),)
    keep, huge = store.best(range(2000, 2120), longest)
    assert keep == 100 and huge is not None and store.state_of(huge) == bytes([2]) * 64
    assert huge.checkpoint_spans == () and store.checkpoints_of(huge) == ()
    for start in (3000, 4000, 5000, 6000):
        assert store.best(range(start, start + 120), longest) == (0, None)
    assert len(store) == 3  # good, huge and the other server's


def test_a_file_that_turns_bad_after_the_scan_is_skipped_when_restored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The files change under an indexed entry: a state that is now a link to /dev/zero
    takes its entry out of the index (the request prefills); checkpoints that now declare
    2^40 entries or are cut short leave the entry without checkpoints. Each warned once."""
    folder = tmp_path / "f"
    writer = HostStore(max_bytes=0, directory=tmp_path, fingerprint="f")
    for start in (1000, 2000, 3000):
        writer.put(range(start, start + 100), b"s" * 64, floor=90,
                   checkpoints=[Checkpoint(60, b"c" * 16, 50)])  # fmt: skip
    store = HostStore(max_bytes=0, directory=tmp_path, fingerprint="f")
    entries = [store.best(range(start, start + 120), longest)[1] for start in (1000, 2000, 3000)]
    zero, huge, cut = (stem_of(folder, start) for start in (1000, 2000, 3000))
    zero.with_suffix(".state").unlink()
    zero.with_suffix(".state").symlink_to("/dev/zero")
    huge.with_suffix(".checkpoints").write_bytes(HUGE_CHECKPOINTS)
    checkpoints = cut.with_suffix(".checkpoints")
    checkpoints.write_bytes(checkpoints.read_bytes()[:-10])
    with caplog.at_level(logging.WARNING, logger="kronk_caching.host_store"):
        for _ in range(2):
            for entry in entries:
                assert entry is not None
                store.state_of(entry)
                store.checkpoints_of(entry)
    assert skipped(caplog) == {
        zero.with_suffix(".state").name: ["a symbolic link"],
        huge.with_suffix(".checkpoints").name: [
            "it declares 1099511627776 checkpoints, more than its 16 bytes can hold"
        ],
        checkpoints.name: ["its checkpoints declare 16 bytes, the file holds 6"],
    }
    assert store.best(range(1000, 1120), longest) == (0, None)  # out of the index
    for start in (2000, 3000):
        keep, entry = store.best(range(start, start + 120), longest)
        assert keep == 100 and entry is not None and entry.checkpoint_spans == ()
        assert not entry.keeps(60) and store.state_of(entry) == b"s" * 64


def test_a_file_system_call_that_does_not_return_holds_the_caller_up_only_so_long(
    tmp_path: Path,
) -> None:
    """A call blocked in the file system (opening a FIFO without O_NONBLOCK waits for a
    writer, as a read of an unreachable NFS server waits) times out; later calls fail at
    once, never queue behind it, until it returns; then the disk is used again."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    calls = DiskCalls(tmp_path, timeout=0.2)
    try:
        with pytest.raises(DiskTimeout):
            calls(fifo.read_bytes)
        with pytest.raises(DiskTimeout, match="has not returned"):
            calls(lambda: "never run")
    finally:
        unblock(fifo)

    def answers() -> bool:
        with contextlib.suppress(DiskTimeout):
            return calls(lambda: "answered") == "answered"
        return False

    assert reached(answers, 30)
    with pytest.raises(FileNotFoundError):  # what a call raises reaches its caller
        calls((tmp_path / "missing").read_bytes)
