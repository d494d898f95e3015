"""A server process that dies by `kill -9` in the middle of writing its host tier to disk.

Run by test_caching.py, beside it, as `python host_tier_writer.py SPEC` (SPEC: JSON with
the model file, the Kronk home, the caching settings, the scenario and the stage to die at).
It holds conversations on model "m" as kronk_testing.conversations.fresh() serves it (one
slot), pickles each answer to SPEC["answers"], and sends itself SIGKILL at `stage` of the
scenario's last disk write:

- scenario "evict": A, then B (A is evicted to disk, whole), then C: B's eviction is cut.
- scenario "write-through" (`host_cache_shared`: written after every request): A (written
  whole), then B: A's eviction writes A again, over its own entry, and is cut.

Stages (HostStore writes each file aside and renames it into place, the tokens file, which
makes the entry visible, last): "state-half-written" dies with half the state in its
partial file; "index-unwritten" dies with the state and checkpoints in place but not the
tokens file.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import signal
import sys
from pathlib import Path
from typing import Any

from kronk_core.contract.types import ChatResult
from kronk_testing.conversations import AGENT_SYSTEMS, ask, conversation, fresh


def die_while_writing(directory: Path, stage: str) -> None:
    """SIGKILL this process at `stage` of its next host-tier write under `directory`."""
    write_bytes, replace = Path.write_bytes, Path.replace

    def writing(path: Path, data: Any) -> int:
        state = path.is_relative_to(directory) and ".state." in path.name  # its partial file
        if stage == "state-half-written" and state:
            with path.open("wb") as file:
                file.write(bytes(data)[: len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        return write_bytes(path, data)

    def renaming(path: Path, target: Any) -> Path:
        renamed = replace(path, target)
        # The state and the checkpoints are in place; the tokens file is not.
        checkpoints = renamed.is_relative_to(directory) and renamed.suffix == ".checkpoints"
        if stage == "index-unwritten" and checkpoints:
            os.kill(os.getpid(), signal.SIGKILL)
        return renamed

    Path.write_bytes = writing  # type: ignore[method-assign,assignment]
    Path.replace = renaming  # type: ignore[method-assign,assignment]


async def main(spec: dict[str, Any]) -> None:
    caching = spec["caching"]
    kronk = fresh(spec["model"], Path(spec["home"]), caching=caching, n_seq_max=1)
    answers: list[ChatResult] = []

    async def turn(messages: list[dict[str, str]]) -> None:
        answers.append(await ask(kronk, "m", messages))
        Path(spec["answers"]).write_bytes(pickle.dumps(answers))

    conversations = [conversation(system, 1) for system in AGENT_SYSTEMS]
    if spec["scenario"] == "evict":
        await turn(conversations.pop(0))
    await turn(conversations.pop(0))
    die_while_writing(Path(caching["host_cache_dir"]), spec["stage"])
    await turn(conversations.pop(0))
    kronk.close()
    sys.exit("the host tier was never written where the process was to die")


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
