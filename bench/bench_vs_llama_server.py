"""Kronk against llama.cpp's llama-server on agentic traffic, side by side in one run.

Both servers run on their defaults (Kronk: no settings for its default model;
llama-server: no tuning flags, the same chat template file as Kronk's bundled gemma
template), each alone on
127.0.0.1, loaded and warmed up with the same request, driven by the same HTTP client
(bench/agent_load.py) with the same conversations:

  W1  one agent, 12 turns (a ~1,100-token system prompt with tool descriptions,
      ~250-token tool results, 24-token greedy replies, streamed)
  D   one stream: cold prefill of a ~4k-token prompt, then greedy decode at that depth
  W2  four agents of the same tool at once, 8 turns each
  W3  sixteen agents at once, 4 turns each (more agents than llama-server's 4 slots)
  S   four chats at once at temperature 0.8 (a chat UI's traffic), 256 tokens each, with
      the same sampling sent to both (top-k 40, top-p 0.9, no DRY or penalties, a seed
      per stream and round): output tok/s over eight rounds with seeds of their own.
      Kronk's rounds run interleaved, in turns whose order rotates, on three servers up
      at once: its defaults, and two whose model has speculation off. The defaults
      against the first says what speculation on by default costs or gains, over all
      rounds and round by round; the two without it against each other say how far one
      round moves when nothing differs (on a 2-core machine, as far as 8%)
  F   a fleet of sixteen agents of different tools (a system prompt each), 4 turns, on
      4 slots: first on conversations the server has not seen, then after one agent ran
      12 turns and four agents 8 turns of the same tasks, so that the fleet's
      conversations begin as those did (branches of stored conversations, as sub-agents
      started from one history, retries and reopened chats are)

Afterwards, in this process, Kronk's own prefill of exactly each W1 turn's new tokens at
its depth (the best a cache can do) and a cold prefill of turn 1, on the model config the
server used. Every figure is printed for both servers with the ratio and its target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from agent_load import Client, Messages, Turn, system_prompt, unique_text
from llama_server import llama_server_binary, no_amx_environment

from kronk_core import Kronk, KronkConfig
from kronk_core.contract.backend import Batch
from kronk_core.contract.sampling import Greedy
from kronk_core.contract.tokens import common_prefix
from kronk_core.settings.model_files import resolve_model_config
from kronk_llamacpp.model import LlamaTextModel
from kronk_llamacpp.packaged import GEMMA_MODEL_ID, gemma_model_path
from kronk_templates.jinja import bundled_source

W1_TURNS, W2_AGENTS, W2_TURNS, W3_AGENTS, W3_TURNS = 12, 4, 8, 16, 4
FLEET_AGENTS, FLEET_TURNS = 16, 4
SAMPLED_STREAMS, SAMPLED_TOKENS, SAMPLED_ROUNDS = 4, 256, 8
# Sent to both servers: their defaults differ (Kronk runs DRY, llama-server top-p 0.95).
SAMPLED = {
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.9,
    "min_p": 0.0,
    "dry_multiplier": 0.0,
    "repeat_penalty": 1.0,
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running(
    name: str, command: list[str], ready_url: str, log_dir: Path, env: dict[str, str] | None = None
) -> Iterator[None]:
    log = (log_dir / f"{name}.log").open("wb")
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
    )
    try:
        deadline = time.monotonic() + 600
        while True:
            if process.poll() is not None:
                raise SystemExit(f"{name} exited with {process.returncode}; see {log.name}")
            try:
                if httpx.get(ready_url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{name} did not become ready; see {log.name}")
            time.sleep(0.25)
        yield
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


@dataclass(frozen=True)
class Output:
    """Tokens one round of part S output, and the seconds it took."""

    tokens: int
    seconds: float


def rate(outputs: list[Output]) -> float:
    """Output tok/s over all of them."""
    return sum(o.tokens for o in outputs) / sum(o.seconds for o in outputs)


@dataclass
class Results:
    w1: list[tuple[Messages, Turn]]
    w1_wall: float
    cold: Turn
    decode: Turn
    w2_wall: float
    w2: list[list[tuple[Messages, Turn]]]
    w3_wall: float
    w3: list[list[tuple[Messages, Turn]]]
    sampled: list[Output]  # each round's
    # Kronk only: the same rounds, interleaved with those above, on two servers whose
    # model has speculation off (what speculation on by default costs or gains, and what
    # one round moves by when nothing differs).
    sampled_plain: list[Output] = field(default_factory=list)
    sampled_control: list[Output] = field(default_factory=list)
    fleet_wall: float = 0.0
    fleet: list[list[tuple[Messages, Turn]]] | None = None
    branched_wall: float = 0.0
    branched: list[list[tuple[Messages, Turn]]] | None = None


def tagged_system(tag: str) -> str:
    # A different first line per workload: no workload reuses another one's cache.
    return f"[session {tag}]\n{system_prompt()}"


def long_prompt() -> Messages:
    text = unique_text(7, 1020)  # about 3,950 tokens
    return [{"role": "user", "content": f"{text}\n\nNow count from 1 to 500, one number a line."}]


async def drive(client: Client, w3: bool, fleets: bool, sampled: bool = True) -> Results:
    w1_wall, (w1,) = await client.agents(1, W1_TURNS, tagged_system("w1"))
    cold = await client.single(long_prompt(), max_tokens=128)
    # The same prompt again: cached, so this measures decode at ~4k tokens of context.
    decode = await client.single(long_prompt(), max_tokens=128)
    w2_wall, w2 = await client.agents(W2_AGENTS, W2_TURNS, tagged_system("w2"))
    w3_wall, w3_runs = 0.0, []
    if w3:
        w3_wall, w3_runs = await client.agents(W3_AGENTS, W3_TURNS, tagged_system("w3"))
    results = Results(w1, w1_wall, cold, decode, w2_wall, w2, w3_wall, w3_runs, [])
    if sampled:
        await drive_sampled(client, results)
    if fleets:
        await drive_fleets(client, results)
    return results


async def drive_fleets(client: Client, results: Results) -> None:
    """F: the distinct-prompt fleet, then the same after its tasks ran (branches)."""
    results.fleet_wall, results.fleet = await client.agents(
        FLEET_AGENTS, FLEET_TURNS, tagged_system("fleet"), distinct=True
    )
    # The same tasks ran before: the fleet's conversations branch from stored ones.
    earlier = tagged_system("branched")
    await client.agents(1, W1_TURNS, earlier, distinct=True)
    await client.agents(W2_AGENTS, W2_TURNS, earlier, distinct=True)
    results.branched_wall, results.branched = await client.agents(
        FLEET_AGENTS, FLEET_TURNS, earlier, distinct=True
    )


async def drive_sampled(client: Client, results: Results) -> None:
    results.sampled += [await sampled_chats(client, round_) for round_ in range(SAMPLED_ROUNDS)]


async def sampled_side_by_side(clients: list[Client]) -> list[list[Output]]:
    """Part S on several servers up at once: each round on each, in an order that rotates
    from round to round, so that neither the machine's slower stretches nor going first
    favour one of them."""
    outputs: list[list[Output]] = [[] for _ in clients]
    for round_ in range(SAMPLED_ROUNDS):
        for turn in range(len(clients)):
            index = (round_ + turn) % len(clients)
            outputs[index].append(await sampled_chats(clients[index], round_))
    return outputs


async def drive_only(client: Client, part: str, sampled: bool = True) -> Results:
    """One part alone: "fleets" (F) or "sampled" (S)."""
    nothing = Turn(0.0, 0.0, 0, 0, 0)
    results = Results([], 0.0, nothing, nothing, 0.0, [], 0.0, [], [])
    if part == "fleets":
        await drive_fleets(client, results)
    elif sampled:
        await drive_sampled(client, results)
    return results


async def sampled_chats(client: Client, round_: int) -> Output:
    """SAMPLED_STREAMS chats at once at temperature 0.8, seeded by the round."""
    streams = [
        Client(client.base_url, client.model, extra={**SAMPLED, "seed": 100 * round_ + index})
        for index in range(SAMPLED_STREAMS)
    ]
    topics = ("a lighthouse keeper", "a lost robot", "two rival bakers", "a winter journey")
    began = time.perf_counter()
    turns = await asyncio.gather(
        *(
            stream.single(
                [{"role": "user", "content": f"Write a long story about {topics[index]}."}],
                max_tokens=SAMPLED_TOKENS,
            )
            for index, stream in enumerate(streams)
        )
    )
    seconds = time.perf_counter() - began
    return Output(sum(turn.completion_tokens for turn in turns), seconds)


async def warm_up(client: Client) -> None:
    await client.single([{"role": "user", "content": "Say hello."}], max_tokens=8)


def gemma_server_command(log_dir: Path, port: int, *options: str) -> list[str]:
    """llama-server on the packaged Gemma with Kronk's bundled gemma template (written to
    log_dir), so that both servers render the same prompts."""
    template = log_dir / "gemma.jinja"
    template.write_text(bundled_source("gemma"), encoding="utf-8")
    return [
        str(llama_server_binary()),
        "-m", str(gemma_model_path()),
        "--host", "127.0.0.1", "--port", str(port),
        *options,
        "--jinja", "--chat-template-file", str(template),
    ]  # fmt: skip


def run_llama_server(log_dir: Path, w3: bool, fleets: bool, only: str | None = None) -> Results:
    port = free_port()
    command = gemma_server_command(log_dir, port)
    client = Client(f"http://127.0.0.1:{port}", GEMMA_MODEL_ID)
    ready = f"{client.base_url}/health"
    with running("llama-server", command, ready, log_dir, no_amx_environment()):
        asyncio.run(warm_up(client))
        if only is not None:
            return asyncio.run(drive_only(client, only))
        return asyncio.run(drive(client, w3, fleets))


def run_kronk(
    log_dir: Path,
    w3: bool,
    fleets: bool,
    model_config: Path | None = None,
    only: str | None = None,
) -> Results:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "kronk_api.cli",
        "server",
        "start",
        "--api-host",
        f"127.0.0.1:{port}",
        "--preload",
        "--base-path",
        str(log_dir / "kronk"),
        "--model",
        GEMMA_MODEL_ID,
    ]
    if model_config is not None:
        command += ["--model-config-file", str(model_config)]
    client = Client(f"http://127.0.0.1:{port}", GEMMA_MODEL_ID)
    # With its defaults, part S runs afterwards, interleaved with servers without speculation.
    side_by_side = model_config is None
    with running("kronk", command, f"{client.base_url}/v1/readiness", log_dir):
        asyncio.run(warm_up(client))
        if only is not None:
            results = asyncio.run(drive_only(client, only, sampled=not side_by_side))
        else:
            results = asyncio.run(drive(client, w3, fleets, sampled=not side_by_side))
        if side_by_side and only != "fleets":
            with without_speculation(log_dir, "kronk-no-speculation") as plain, \
                    without_speculation(log_dir, "kronk-no-speculation-2") as control:  # fmt: skip
                outputs = asyncio.run(sampled_side_by_side([client, plain, control]))
            results.sampled, results.sampled_plain, results.sampled_control = outputs
    return results


@contextmanager
def kronk_with(
    log_dir: Path, name: str, model_id: str, settings: dict[str, object]
) -> Iterator[Client]:
    """A Kronk server on `model_id` with these settings in its entry, warmed up."""
    port = free_port()
    model_config = log_dir / f"{name}.yaml"
    entry = {model_id: settings}
    model_config.write_text(json.dumps({"models": entry}), encoding="utf-8")  # JSON is YAML
    command = [
        sys.executable, "-m", "kronk_api.cli", "server", "start",
        "--api-host", f"127.0.0.1:{port}", "--preload", "--base-path", str(log_dir / name),
        "--model", model_id, "--model-config-file", str(model_config),
    ]  # fmt: skip
    client = Client(f"http://127.0.0.1:{port}", model_id)
    with running(name, command, f"{client.base_url}/v1/readiness", log_dir):
        asyncio.run(warm_up(client))
        yield client


@contextmanager
def without_speculation(log_dir: Path, name: str) -> Iterator[Client]:
    """A Kronk server whose default model has speculation off, warmed up.

    A server of its own rather than a second model in the same one: idle, it takes no
    time from the others, while a second model in one process would."""
    with kronk_with(log_dir, name, GEMMA_MODEL_ID, {"draft_strategy": "none"}) as client:
        yield client


def kronk_references(w1: list[tuple[Messages, Turn]]) -> tuple[float, list[tuple[int, float]]]:
    """Cold prefill of turn 1; for later turns (new tokens, seconds to prefill only them).

    Each is the median of three prefills: one prefill of a few hundred tokens varies by
    about 10% on a 2-core machine, as much as the margin it is compared with."""
    kronk = Kronk(KronkConfig(default_model=GEMMA_MODEL_ID))
    loaded = kronk.load()
    prompts, replies = [], []
    for messages, turn in w1:
        request = kronk.chat_request(messages)
        prompts.append(loaded.render(request.messages, kronk.render_options(request)))
        replies.append(loaded.tokenize_prompt(turn.reply))
    config = resolve_model_config(kronk.config, GEMMA_MODEL_ID, {}, kronk.models.sources())
    kronk.close()
    model = LlamaTextModel(config)
    try:
        cold = statistics.median(_prefill(model, prompts[0], 0) for _ in range(3))
        turns = []
        for number in range(1, len(prompts)):
            reused = common_prefix(prompts[number], prompts[number - 1] + replies[number - 1])
            reused = min(reused, len(prompts[number]) - 1)
            model.seq_remove(0, 0, -1)
            _prefill(model, prompts[number][:reused], 0, timed=False)
            # The sliding-window cells a prefill pushed out do not come back when its tokens
            # are removed: each repeat starts from the saved state of the reused prefix.
            reused_state, samples = model.seq_state(0), []
            for _ in range(3):
                model.seq_remove(0, 0, -1)
                model.set_seq_state(0, reused_state)
                samples.append(_prefill(model, prompts[number], reused))
            turns.append((len(prompts[number]) - reused, statistics.median(samples)))
        return cold, turns
    finally:
        model.close()


def _prefill(model: LlamaTextModel, tokens: list[int], start: int, timed: bool = True) -> float:
    """Decode tokens[start:] in n_batch chunks (as the engine does) and sample the next one."""
    model.seq_remove(0, start, -1)
    began = time.perf_counter()
    chunk = 2048
    for offset in range(start, len(tokens), chunk):
        batch = Batch()
        end = min(offset + chunk, len(tokens))
        for position in range(offset, end):
            batch.add(tokens[position], position, 0, timed and position == len(tokens) - 1)
        model.decode(batch)
    if timed:
        sampler = model.new_sampler([Greedy()])
        sampler.sample(len(batch) - 1)
        sampler.close()
    return time.perf_counter() - began


def _ratio(kronk: float, llama: float) -> str:
    return f"{kronk / llama:.2f}x" if llama else "n/a"


def _row(name: str, llama: float, kronk: float, target: str, unit: str = "s") -> None:
    print(f"{name:<44}{llama:>12.2f}{kronk:>12.2f}{_ratio(kronk, llama):>9}  {target}  ({unit})")


def _decode_rate(turn: Turn) -> float:
    span = turn.last_token_at - turn.first_token_at
    return (turn.completion_tokens - 1) / span if span > 0 else 0.0


def _ttfts(runs: list[list[tuple[Messages, Turn]]]) -> list[float]:
    return [turn.ttft for run in runs for _, turn in run]


def _uncached(runs: list[list[tuple[Messages, Turn]]]) -> int:
    """Turns after an agent's first that reused nothing (its own last turn is there)."""
    return sum(1 for run in runs for _, turn in run[1:] if not turn.cached_tokens)


def _prefilled(runs: list[list[tuple[Messages, Turn]]]) -> int:
    """Prompt tokens the server computed: what its usage says it did not take from a cache."""
    return sum(turn.prompt_tokens - turn.cached_tokens for run in runs for _, turn in run)


def _errors(runs: list[list[tuple[Messages, Turn]]]) -> int:
    return sum(1 for run in runs for _, turn in run if turn.error)


def report(llama: Results, kronk: Results, cold: float, refs: list[tuple[int, float]]) -> None:
    print("\nW1: one agent, 12 turns (seconds)")
    print(
        f"{'turn':<6}{'new tok':>8}{'llama TTFT':>12}{'kronk TTFT':>12}{'kronk cached':>14}"
        f"{'prefill new':>13}{'TTFT/prefill':>14}"
    )
    worst = 0.0
    for number, ((_, ls), (_, ks)) in enumerate(zip(llama.w1, kronk.w1, strict=True)):
        if number == 0:
            new, reference = ks.prompt_tokens, cold
        else:
            new, reference = refs[number - 1]
            worst = max(worst, ks.ttft / reference)
        print(
            f"{number + 1:<6}{new:>8}{ls.ttft:>12.3f}{ks.ttft:>12.3f}{ks.cached_tokens:>14}"
            f"{reference:>13.3f}{ks.ttft / reference:>13.2f}x"
        )
    print(f"\n{'figure':<44}{'llama-srv':>12}{'kronk':>12}{'ratio':>9}  target")
    _row("W1 wall", llama.w1_wall, kronk.w1_wall, "<= 0.90x")
    _row(
        "W1 TTFT summed",
        sum(t.ttft for _, t in llama.w1),
        sum(t.ttft for _, t in kronk.w1),
        "<= 0.80x",
    )
    _row("W1 turn 1 TTFT", llama.w1[0][1].ttft, kronk.w1[0][1].ttft, "-")
    print(
        f"{'W1 turn 1 TTFT / kronk cold prefill':<44}{'':>12}{kronk.w1[0][1].ttft / cold:>12.2f}"
        f"{'':>9}  <= 1.05"
    )
    print(
        f"{'W1 turns 2-12: worst TTFT / new-token prefill':<44}{'':>12}{worst:>12.2f}{'':>9}"
        "  <= 1.10"
    )
    _row(
        f"cold prefill, {kronk.cold.prompt_tokens}-token prompt",
        llama.cold.prompt_tokens / llama.cold.ttft,
        kronk.cold.prompt_tokens / kronk.cold.ttft,
        ">= 0.97x",
        "tok/s",
    )
    _row(
        "decode at ~4k context, one stream",
        _decode_rate(llama.decode),
        _decode_rate(kronk.decode),
        ">= 0.97x",
        "tok/s",
    )
    _row("W2 wall (4 agents x 8 turns)", llama.w2_wall, kronk.w2_wall, "<= 0.95x")
    _row("W2 TTFT summed", sum(_ttfts(llama.w2)), sum(_ttfts(kronk.w2)), "<= 0.80x")
    if kronk.w3:
        _row("W3 wall (16 agents x 4 turns)", llama.w3_wall, kronk.w3_wall, "-")
        _row("W3 TTFT summed", sum(_ttfts(llama.w3)), sum(_ttfts(kronk.w3)), "<= 0.50x")
        print(
            f"{'W3 requests refused or failed':<44}{_errors(llama.w3):>12}{_errors(kronk.w3):>12}"
            f"{'':>9}  kronk: 0"
        )
    report_fleets(llama, kronk)
    report_sampled(llama, kronk)
    failed = _errors([llama.w1, *llama.w2]) + _errors([kronk.w1, *kronk.w2])
    if failed:
        print(f"\nWARNING: {failed} W1/W2 requests failed; see the server logs")


def report_sampled(llama: Results, kronk: Results) -> None:
    label = f"S: {SAMPLED_STREAMS} chats at temperature 0.8, {SAMPLED_ROUNDS} rounds"
    _row(label, rate(llama.sampled), rate(kronk.sampled), ">= 0.97x", "tok/s")
    if not kronk.sampled_plain:
        return
    for name, ours, theirs in (
        ("with speculation (default) / without", kronk.sampled, kronk.sampled_plain),
        ("without / without (nothing differs)", kronk.sampled_control, kronk.sampled_plain),
    ):
        ratios = [rate([a]) / rate([b]) for a, b in zip(ours, theirs, strict=True)]
        print(
            f"S, Kronk {name}, each round: "
            + ", ".join(f"{r:.2f}" for r in ratios)
            + f" (worst {min(ratios):.2f}x)"
        )
    _row(
        "S: speculation, all rounds (without | with)",
        rate(kronk.sampled_plain),
        rate(kronk.sampled),
        ">= 0.97x",
        "tok/s",
    )


def report_fleets(llama: Results, kronk: Results) -> None:
    for name, ours, theirs, wall in (
        ("F", kronk.fleet, llama.fleet, (llama.fleet_wall, kronk.fleet_wall)),
        ("F after the same tasks", kronk.branched, llama.branched,
         (llama.branched_wall, kronk.branched_wall)),
    ):  # fmt: skip
        if ours is None or theirs is None:
            continue
        label = f"{name} ({FLEET_AGENTS} agents x {FLEET_TURNS} turns, 4 slots)"
        _row(f"{label} wall", wall[0], wall[1], "<= 0.90x")
        _row(f"{name}: TTFT summed", sum(_ttfts(theirs)), sum(_ttfts(ours)), "-")
        # The fleet's wall time is mostly prefill: the same work on both is a fair race.
        prefilled = _prefilled(theirs), _prefilled(ours)
        _row(f"{name}: prompt tokens prefilled", *prefilled, "-", "tokens")
        print(
            f"{name + ': later turns with nothing cached':<44}{_uncached(theirs):>12}"
            f"{_uncached(ours):>12}{'':>9}  kronk: 0"
        )
        print(
            f"{name + ': requests refused or failed':<44}{_errors(theirs):>12}"
            f"{_errors(ours):>12}{'':>9}  kronk: 0"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-w3", action="store_true", help="skip W3 (the longest workload)")
    parser.add_argument(
        "--no-fleets", action="store_true", help="skip F (the fleets: the longest part)"
    )
    parser.add_argument(
        "--only-fleets", action="store_true", help="run F alone (both fleets, both servers)"
    )
    parser.add_argument(
        "--only-sampled",
        action="store_true",
        help="run S alone (both servers; Kronk with speculation and without)",
    )
    parser.add_argument("--logs", type=Path, help="keep the server logs here")
    parser.add_argument(
        "--kronk-model-config",
        type=Path,
        help="run Kronk with this model-config file instead of its defaults (e.g. "
        "draft_strategy: none, Kronk without speculation); the targets are for the defaults",
    )
    args = parser.parse_args()
    only = "fleets" if args.only_fleets else "sampled" if args.only_sampled else None
    llama_server_binary()  # build before anything is timed
    with tempfile.TemporaryDirectory(prefix="kronk-vs-llama-") as scratch:
        log_dir = args.logs or Path(scratch)
        log_dir.mkdir(parents=True, exist_ok=True)
        print("running llama-server ...", flush=True)
        llama = run_llama_server(log_dir, not args.no_w3, not args.no_fleets, only)
        print("running kronk ...", flush=True)
        kronk = run_kronk(
            log_dir, not args.no_w3, not args.no_fleets, args.kronk_model_config, only
        )
    if only is not None:
        print(f"\n{'figure':<44}{'llama-srv':>12}{'kronk':>12}{'ratio':>9}  target")
        (report_fleets if only == "fleets" else report_sampled)(llama, kronk)
        return
    print("measuring kronk's own prefill references ...", flush=True)
    cold, refs = kronk_references(kronk.w1)
    report(llama, kronk, cold, refs)


if __name__ == "__main__":
    main()
