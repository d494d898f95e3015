"""The default model's agent fleets against llama-server, in both of Kronk's KV layouts.

Issue 41's workloads on SmolLM2-135M-Instruct, the default model, with the conversations of
bench_vs_llama_server.py: W2 (four agents of one tool at once, 8 turns), W3 (sixteen agents
of one tool, 4 turns, on 4 slots), F (sixteen agents with distinct system prompts, 4 turns)
and F after the same tasks ran (a server that served other traffic first: one agent's 12
turns and four agents' 8 turns of those tasks, untimed, then F again, whose conversations
branch from stored ones). They run in one process on three servers one after another:
llama-server (`-c 32768 -np 4`, one KV stream per slot, its embedded template), Kronk on its
defaults (8,192 tokens x 4 slots; `kv_unified: auto`, for this model a stream per slot, as
llama-server) and Kronk with one pool (`kv_unified: true`). Each is warmed up with the same
request; with several rounds the order rotates. Prints each round's wall times and
Kronk / llama-server.

Run: python bench/bench_fleet_layout.py [--rounds N] [--parts w2,w3,f,after]
     [--servers llama-server,kronk,kronk-unified,kronk-no-draft]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from agent_load import Client, Messages, Turn
from bench_vs_llama_server import (
    FLEET_AGENTS,
    FLEET_TURNS,
    W1_TURNS,
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


# A part's timed run: its wall time and the prompt tokens the server prefilled (not cached).
Timed = tuple[float, int]
Run = tuple[float, list[list[tuple[Messages, Turn]]]]


async def timed(run: Awaitable[Run]) -> Timed:
    wall, agents = await run
    prefilled = sum(t.prompt_tokens - t.cached_tokens for turns in agents for _, t in turns)
    return wall, prefilled


async def after_traffic(client: Client) -> Timed:
    earlier = tagged_system("after")
    await client.agents(1, W1_TURNS, earlier, distinct=True)
    await client.agents(W2_AGENTS, W2_TURNS, earlier, distinct=True)
    return await timed(client.agents(FLEET_AGENTS, FLEET_TURNS, earlier, distinct=True))


# Each part's timed run (the untimed traffic before "after" included in its run only).
PARTS: dict[str, tuple[str, Callable[[Client], Awaitable[Timed]]]] = {
    "w2": (
        f"W2: {W2_AGENTS} agents x {W2_TURNS} turns",
        lambda c: timed(c.agents(W2_AGENTS, W2_TURNS, tagged_system("w2"))),
    ),
    "w3": (
        f"W3: {W3_AGENTS} agents x {W3_TURNS} turns",
        lambda c: timed(c.agents(W3_AGENTS, W3_TURNS, tagged_system("w3"))),
    ),
    "f": (
        f"F: {FLEET_AGENTS} distinct x {FLEET_TURNS} turns",
        lambda c: timed(c.agents(FLEET_AGENTS, FLEET_TURNS, tagged_system("fleet"), distinct=True)),
    ),
    "after": ("F after the same tasks", after_traffic),
}


async def fleets(client: Client, parts: list[str]) -> list[Timed]:
    return [await PARTS[part][1](client) for part in parts]


def llama_server(log_dir: Path, parts: list[str]) -> list[Timed]:
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
        return asyncio.run(fleets(client, parts))


def kronk(log_dir: Path, name: str, settings: dict[str, object], parts: list[str]) -> list[Timed]:
    with kronk_with(log_dir, name, DEFAULT_MODEL_ID, settings) as client:
        return asyncio.run(fleets(client, parts))


SERVERS: dict[str, Callable[[Path, list[str]], list[Timed]]] = {
    "llama-server": llama_server,
    "kronk": lambda log_dir, parts: kronk(log_dir, "kronk", {}, parts),
    "kronk-unified": lambda log_dir, parts: kronk(
        log_dir, "kronk-unified", {"llamacpp": {"kv_unified": True}}, parts
    ),
    # Prompt lookup off: llama-server here drafts nothing either.
    "kronk-no-draft": lambda log_dir, parts: kronk(
        log_dir, "kronk-no-draft", {"draft_strategy": "none"}, parts
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="each server this many times")
    parser.add_argument("--parts", default="w2,w3,f,after", help=f"of {','.join(PARTS)}")
    parser.add_argument("--servers", default=",".join(SERVERS), help=f"of {','.join(SERVERS)}")
    args = parser.parse_args()
    parts, names = args.parts.split(","), args.servers.split(",")
    unknown = [p for p in parts if p not in PARTS] + [n for n in names if n not in SERVERS]
    if unknown or "llama-server" not in names:
        parser.error(f"unknown parts or servers {unknown}, or no llama-server to compare with")
    llama_server_binary()  # built before anything is timed
    walls: dict[str, list[list[Timed]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="kronk-fleet-layout-") as scratch:
        for round_ in range(args.rounds):
            # The order rotates from round to round: going first, or the machine's slower
            # stretches, favour no server.
            for turn in range(len(names)):
                name = names[(round_ + turn) % len(names)]
                print(f"round {round_ + 1}: {name} ...", flush=True)
                walls[name].append(SERVERS[name](Path(scratch), parts))
    kronks = [name for name in names if name != "llama-server"]
    print(f"\n{'round, workload':<40}{'llama-server':>13}" + "".join(f"{n:>24}" for n in kronks))
    for round_ in range(args.rounds):
        for index, part in enumerate(parts):
            theirs, their_prefill = walls["llama-server"][round_][index]
            row = f"{round_ + 1}, {PARTS[part][0]:<37}{theirs:>12.1f}s"
            prefills = f"{'   prompt tokens prefilled':<40}{their_prefill:>13}"
            for name in kronks:
                ours, our_prefill = walls[name][round_][index]
                row += f"{ours:>14.1f}s ({ours / theirs:.2f}x)"
                prefills += f"{our_prefill:>24}"
            print(row)
            print(prefills)


if __name__ == "__main__":
    main()
