"""The default model's agent fleets against llama-server, in both of Kronk's KV layouts.

Issue 41's W2 (four agents of one tool at once, 8 turns) and W3 (sixteen agents, 4 turns,
on 4 slots) on SmolLM2-135M-Instruct, the default model, with the conversations of
bench_vs_llama_server.py, run in one process on three servers one after another: llama-server
(`-c 32768 -np 4`, one KV stream per slot, its embedded template), Kronk with one pool
(8,192 tokens x 4 slots, `kv_unified: true`) and Kronk with `kv_unified: false` (one stream
per slot, as llama-server; `auto` takes it for this model). Each is warmed up with the same
request; with several rounds the order rotates. Prints each round's wall times and
Kronk / llama-server.

Run: python bench/bench_fleet_layout.py [--rounds N] [--no-w3]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path

from agent_load import Client
from bench_vs_llama_server import (
    W2_AGENTS,
    W2_TURNS,
    W3_AGENTS,
    W3_TURNS,
    free_port,
    kronk_with,
    running,
    tagged_system,
    warm_up,
)
from llama_server import llama_server_binary, no_amx_environment

from kronk_llamacpp.packaged import DEFAULT_MODEL_ID, default_model_path

SLOTS, WINDOW = 4, 8192


async def fleets(client: Client, w3: bool) -> list[float]:
    walls = [(await client.agents(W2_AGENTS, W2_TURNS, tagged_system("w2")))[0]]
    if w3:
        walls.append((await client.agents(W3_AGENTS, W3_TURNS, tagged_system("w3")))[0])
    return walls


def llama_server(log_dir: Path, w3: bool) -> list[float]:
    port = free_port()
    command = [
        str(llama_server_binary()), "-m", str(default_model_path()),
        "--host", "127.0.0.1", "--port", str(port),
        "-c", str(SLOTS * WINDOW), "-np", str(SLOTS), "--jinja",
    ]  # fmt: skip
    client = Client(f"http://127.0.0.1:{port}", DEFAULT_MODEL_ID)
    with running("llama-server", command, f"{client.base_url}/health", log_dir,
                 no_amx_environment()):  # fmt: skip
        asyncio.run(warm_up(client))
        return asyncio.run(fleets(client, w3))


def kronk(log_dir: Path, name: str, unified: bool, w3: bool) -> list[float]:
    settings: dict[str, object] = {"llamacpp": {"kv_unified": unified}}
    with kronk_with(log_dir, name, DEFAULT_MODEL_ID, settings) as client:
        return asyncio.run(fleets(client, w3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-w3", action="store_true", help="W2 only")
    parser.add_argument("--rounds", type=int, default=1, help="each server this many times")
    args = parser.parse_args()
    w3 = not args.no_w3
    llama_server_binary()  # built before anything is timed
    with tempfile.TemporaryDirectory(prefix="kronk-fleet-layout-") as scratch:
        log_dir = Path(scratch)
        runs: dict[str, Callable[[], list[float]]] = {
            "llama-server": lambda: llama_server(log_dir, w3),
            "kronk unified": lambda: kronk(log_dir, "kronk-unified", True, w3),
            "kronk per slot": lambda: kronk(log_dir, "kronk-per-slot", False, w3),
        }
        names = list(runs)
        walls: dict[str, list[list[float]]] = {name: [] for name in names}
        for round_ in range(args.rounds):
            # The order rotates from round to round: going first, or the machine's slower
            # stretches, favour no server.
            for turn in range(len(names)):
                name = names[(round_ + turn) % len(names)]
                print(f"round {round_ + 1}: {name} ...", flush=True)
                walls[name].append(runs[name]())
    parts = ["W2 wall (4 agents x 8 turns)"] + (["W3 wall (16 agents x 4 turns)"] if w3 else [])
    print(
        f"\n{'figure':<32}{'llama-srv':>11}{'unified':>11}{'ratio':>8}{'per slot':>11}{'ratio':>8}"
    )
    for round_ in range(args.rounds):
        for index, part in enumerate(parts):
            theirs = walls["llama-server"][round_][index]
            one_pool = walls["kronk unified"][round_][index]
            per_slot = walls["kronk per slot"][round_][index]
            print(
                f"{part:<32}{theirs:>10.1f}s{one_pool:>10.1f}s{one_pool / theirs:>7.2f}x"
                f"{per_slot:>10.1f}s{per_slot / theirs:>7.2f}x"
            )


if __name__ == "__main__":
    main()
