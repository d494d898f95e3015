"""GPU benchmark: Kronk next to llama.cpp's own tools, side by side in one run.

  A. decode throughput at 1/4/16/32 sequences: llama-batched-bench (S_TG, the C++
     reference) vs the Kronk engine through the SDK (greedy streams of --tokens tokens,
     decode phase only), once per --engine-variants (overlapped decoding and device
     sampling off and on). Targets: kronk/C++ >= 0.95 at 1 sequence, >= 0.9 at 32.
  B. Python per-step overhead: per engine step, wall time minus the time the engine thread
     waits for the device (the decode call and its synchronize), and a bare ctypes greedy
     loop for one stream.
  C. agentic workloads over HTTP, llama-server vs `kronk server start` (same model, same
     chat template, greedy): one agent x 12 turns and 4 agents x 8 turns (the tool-result
     conversations of bench_caching.py). Target: Kronk wall <= 1.0x llama-server.

Run it where llama.cpp's tools are built (on the GPU machine: `bash bench/gpu/run.sh`,
see docs/gpu.md). `--smoke` runs every part with tiny numbers, to check it end to end on
a CPU. Writes everything as JSON to --json.

usage: bench_gpu.py MODEL.gguf --llama-bin DIR [--streams 1,4,16,32] [--tokens 128]
                    [--engine-variants host,overlap,device,both] [--template chatml]
                    [--n-gpu-layers 0] [--json OUT] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from bench_caching import system_prompt, tool_result
from bench_engine import bare_loop

from kronk_core import Kronk, KronkConfig, ModelConfig

Messages = list[dict[str, str]]
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "theta",
    "kappa",
    "lambda",
    "sigma",
    "omega",
    "file",
    "line",
]


def prompt(i: int, words: int) -> str:
    return f"Stream {i}. Continue: " + " ".join(
        WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(words)
    )


# ---- A. llama-batched-bench --------------------------------------------------------


def batched_bench(args: argparse.Namespace) -> dict[int, float]:
    """S_TG (generated tok/s) per sequence count, from llama-batched-bench's JSON lines."""
    command = [
        str(args.llama_bin / "llama-batched-bench"), "-m", str(args.model),
        "-ngl", "99" if args.n_gpu_layers == 0 else str(max(args.n_gpu_layers, 0)),
        "-c", str(max(args.streams) * (args.prompt_words * 2 + args.tokens + 64)), "-kvu",
        "-npp", str(args.prompt_words), "-ntg", str(args.tokens),
        "-npl", ",".join(map(str, args.streams)), "--output-format", "jsonl", *args.llama_arg,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        raise RuntimeError(f"llama-batched-bench failed: {done.stderr[-1500:]}")
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"n_kv_max')]
    return {int(row["pl"]): float(row["speed_tg"]) for row in rows}


# ---- A + B. the Kronk engine --------------------------------------------------------


# How the engine meets the device (the llamacpp section's keys; both off by default).
VARIANTS: dict[str, dict[str, bool]] = {
    "host": {"overlap_decode": False, "device_sampling": False},
    "overlap": {"overlap_decode": True, "device_sampling": False},
    "device": {"overlap_decode": False, "device_sampling": True},
    "both": {"overlap_decode": True, "device_sampling": True},
}


class DeviceTimer:
    """Times the engine thread's waits for the device: each decode call, with the wait for
    it to finish (`synchronize`: inside the decode's timing where the engine does not
    overlap, else where the engine calls it, after handing out the last step's text)."""

    def __init__(self, model: Any, overlap: bool) -> None:
        self.calls = 0
        self.seconds = 0.0
        decode: Callable[[Any], None] = model.decode
        synchronize: Callable[[], None] = model.synchronize

        def timed_decode(batch: Any) -> None:
            began = time.perf_counter()
            decode(batch)
            if not overlap:
                synchronize()  # else the wait would land in the first logits read
            self.seconds += time.perf_counter() - began
            self.calls += 1

        def timed_synchronize() -> None:
            began = time.perf_counter()
            synchronize()
            self.seconds += time.perf_counter() - began

        model.decode = timed_decode
        model.synchronize = timed_synchronize


async def engine_streams(kronk: Kronk, streams: int, tokens: int, words: int) -> int:
    """`streams` concurrent greedy chats of at most `tokens` tokens; returns tokens produced."""

    async def one(i: int) -> int:
        produced = 0
        async for delta in kronk.chat_stream(
            [{"role": "user", "content": prompt(i, words)}],
            model="bench", max_tokens=tokens, temperature=0, dry_multiplier=0,
        ):  # fmt: skip
            if delta.usage is not None:
                produced = delta.usage.completion_tokens
        return produced

    return sum(await asyncio.gather(*(one(i) for i in range(streams))))


def kronk_engine(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    """Decode throughput and per-step split, by difference: a run of --tokens tokens minus
    the same run of one token (prefill and first token cancel out, as in S_TG)."""
    llamacpp = {"n_gpu_layers": args.n_gpu_layers, **VARIANTS[variant], **args.llamacpp}
    config = ModelConfig(
        model_path=args.model, context_window=args.engine_context, n_seq_max=max(args.streams),
        templates={"template": args.template}, llamacpp=llamacpp,
        draft_strategy="none",  # one token per slot and step, as llama-batched-bench decodes
    )  # fmt: skip
    kronk = Kronk(KronkConfig(default_model="bench", models={"bench": config}))
    began = time.perf_counter()
    loaded = kronk.load("bench")
    report: dict[str, Any] = {"load_s": round(time.perf_counter() - began, 3), "runs": []}
    timer = DeviceTimer(loaded.model, VARIANTS[variant]["overlap_decode"])

    def measure(streams: int, tokens: int) -> tuple[float, int, int, int, float]:
        before = (loaded.engine.stats().steps, timer.calls, timer.seconds)
        started = time.perf_counter()
        produced = asyncio.run(engine_streams(kronk, streams, tokens, args.prompt_words))
        wall = time.perf_counter() - started
        steps = loaded.engine.stats().steps - before[0]
        return wall, produced, steps, timer.calls - before[1], timer.seconds - before[2]

    measure(max(args.streams), 8)  # warm-up
    for streams in args.streams:
        short, full = measure(streams, 1), measure(streams, args.tokens)
        wall, produced, steps, calls, seconds = (f - s for f, s in zip(full, short, strict=True))
        step_ms = wall * 1000 / steps if steps > 0 else None
        device_ms = seconds * 1000 / calls if calls > 0 else None
        run = {
            "variant": variant,
            "streams": streams,
            "completion_tokens": full[1],
            "wall_s": round(full[0], 3),
            "decode_tok_s": round(produced / wall, 2) if wall > 0 and produced > 0 else None,
            "steps": steps,
            "step_ms": None if step_ms is None else round(step_ms, 3),
            "device_ms": None if device_ms is None else round(device_ms, 3),
            # What the device waits for in a step: scheduling, sampling, and (without
            # overlap) detokenizing, stop strings and events.
            "python_ms": None
            if step_ms is None or device_ms is None
            else round(step_ms - device_ms, 3),
        }
        report["runs"].append(run)
        print(json.dumps(run), flush=True)
    kronk.close()
    return report


def engine_variants(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    return {variant: kronk_engine(args, variant) for variant in args.engine_variants}


def switch_intervals(args: argparse.Namespace) -> list[tuple[float, dict[str, Any]]]:
    results = []
    default = sys.getswitchinterval()
    try:
        for interval in (float(v) for v in args.switch_intervals.split(",")):
            sys.setswitchinterval(interval)
            results.append((interval, kronk_engine(args, args.engine_variants[-1])))
    finally:
        sys.setswitchinterval(default)
    return results


def bare(args: argparse.Namespace) -> float:
    """Tok/s of a bare ctypes greedy loop (one stream), in its own process."""
    config = ModelConfig(
        model_path=args.model,
        context_window=args.engine_context,
        llamacpp={"n_gpu_layers": args.n_gpu_layers},
    )
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return float(pool.submit(bare_loop, config, args.tokens).result())


# ---- C. servers on agentic workloads ------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def running(command: list[str], url: str, log: Path, timeout: float) -> Iterator[None]:
    """Start a server, wait until `url` answers 200 (or the process dies), stop it after."""
    with log.open("w") as sink:
        process = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{command[0]} exited ({process.returncode}); see {log}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} not ready after {timeout:.0f} s; see {log}")
            time.sleep(0.2)
        yield
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


async def agent_turns(
    client: httpx.AsyncClient, url: str, agent: int, turns: int, args: argparse.Namespace
) -> list[float]:
    """One agent: a growing conversation, one tool result per turn; returns TTFT per turn."""
    messages: Messages = [{"role": "system", "content": system_prompt(agent, args.system_words)}]
    ttfts = []
    for number in range(turns):
        messages.append({"role": "user", "content": tool_result(agent, number)})
        body = {"model": "bench", "messages": messages, "max_tokens": args.reply_tokens,
                "temperature": 0, "stream": True}  # fmt: skip
        began, first, parts = time.perf_counter(), 0.0, []
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                raise RuntimeError(
                    f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
                )
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                for choice in json.loads(line[5:]).get("choices") or []:
                    text = (choice.get("delta") or {}).get("content") or ""
                    if text and not first:
                        first = time.perf_counter() - began
                    parts.append(text)
        ttfts.append(first or time.perf_counter() - began)
        messages.append({"role": "assistant", "content": "".join(parts)})
    return ttfts


async def workload(url: str, agents: int, turns: int, args: argparse.Namespace) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=args.timeout, trust_env=False) as client:
        began = time.perf_counter()
        ttfts = await asyncio.gather(
            *(agent_turns(client, url, a, turns, args) for a in range(agents))
        )
        wall = time.perf_counter() - began
    flat = [t for agent in ttfts for t in agent]
    return {
        "agents": agents,
        "turns": turns,
        "wall_s": round(wall, 3),
        "ttft_sum_s": round(sum(flat), 3),
        "ttft_median_s": round(statistics.median(flat), 4),
    }


def servers(args: argparse.Namespace, work: Path) -> dict[str, list[dict[str, Any]]]:
    slots = max(agents for agents, _ in args.workloads)
    results: dict[str, list[dict[str, Any]]] = {}
    port = free_port()
    llama = [
        str(args.llama_bin / "llama-server"), "-m", str(args.model), "-ngl",
        "99" if args.n_gpu_layers == 0 else str(max(args.n_gpu_layers, 0)),
        "-np", str(slots), "-c", str(slots * args.context_window),
        "--chat-template", args.template, "--host", "127.0.0.1", "--port", str(port), "-a", "bench",
        *args.llama_arg,
    ]  # fmt: skip
    with running(llama, f"http://127.0.0.1:{port}/health", work / "llama-server.log", args.timeout):
        results["llama-server"] = [
            asyncio.run(workload(f"http://127.0.0.1:{port}", a, t, args)) for a, t in args.workloads
        ]
    (work / "kronk.yaml").write_text(
        json.dumps(
            {
                "models": {
                    "bench": {
                        "model_path": str(args.model),
                        "n_seq_max": slots,
                        "context_window": args.context_window,
                        "cache": "imc",
                        "templates": {"template": args.template},
                        "llamacpp": {"n_gpu_layers": args.n_gpu_layers},
                    }
                }
            }
        )
    )
    port = free_port()
    kronk = [
        sys.executable, "-m", "kronk_api.cli", "server", "start", "--api-host", f"127.0.0.1:{port}",
        "--model-config-file", str(work / "kronk.yaml"), "--model", "bench", "--preload",
        "--base-path", str(work / "kronk-home"), "--log-level", "warning",
    ]  # fmt: skip
    with running(
        kronk, f"http://127.0.0.1:{port}/v1/readiness", work / "kronk-server.log", args.timeout
    ):
        results["kronk"] = [
            asyncio.run(workload(f"http://127.0.0.1:{port}", a, t, args)) for a, t in args.workloads
        ]
    return results


# ---- report --------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def print_report(report: dict[str, Any]) -> None:
    print("\nA. decode tok/s, kronk engine vs llama-batched-bench (S_TG)")
    print(
        f"{'variant':>8}{'seqs':>6}{'kronk':>10}{'C++':>10}{'ratio':>8}{'target':>8}"
        f"{'step ms':>9}{'device ms':>11}{'python ms':>11}"
    )
    reference = report.get("batched_bench") or {}
    runs = [
        (run, f" (switch interval {interval})" if interval else "")
        for interval, engines in [
            (None, report.get("engine", {})),
            *((i, {"switch": e}) for i, e in report.get("switch", [])),
        ]
        for engine in engines.values()
        for run in engine.get("runs", [])
    ]
    for run, note in runs:
        cxx = reference.get(run["streams"])
        ratio = run["decode_tok_s"] / cxx if cxx and run["decode_tok_s"] else None
        target = "0.95" if run["streams"] == 1 else "0.90" if run["streams"] >= 32 else ""
        print(
            f"{run['variant']:>8}{run['streams']:>6}{run['decode_tok_s'] or 0:>10.1f}"
            f"{cxx or 0:>10.1f}{ratio or 0:>8.2f}{target:>8}{_ms(run['step_ms']):>9}"
            f"{_ms(run['device_ms']):>11}{_ms(run['python_ms']):>11}{note}"
        )
    if "bare_tok_s" in report:
        print(f"bare ctypes greedy loop, 1 stream: {report['bare_tok_s']:.1f} tok/s")
    print("\nC. agentic workloads over HTTP (wall s; target kronk/llama-server <= 1.0)")
    print(
        f"{'workload':>14}{'llama-server':>14}{'kronk':>10}{'ratio':>8}{'ttft sum C++':>14}"
        f"{'ttft sum kronk':>16}"
    )
    runs = report.get("servers", {})
    for cxx, ours in zip(runs.get("llama-server", []), runs.get("kronk", []), strict=False):
        name = f"{cxx['agents']}x{cxx['turns']} turns"
        print(
            f"{name:>14}{cxx['wall_s']:>14.2f}{ours['wall_s']:>10.2f}"
            f"{ours['wall_s'] / cxx['wall_s']:>8.2f}"
            f"{cxx['ttft_sum_s']:>14.2f}{ours['ttft_sum_s']:>16.2f}"
        )
    for part, error in report.get("errors", {}).items():
        print(f"{part}: FAILED: {error}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument(
        "--llama-bin", type=Path, required=True, help="llama-batched-bench and llama-server"
    )
    parser.add_argument("--streams", default="1,4,16,32")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt-words", type=int, default=100)
    parser.add_argument("--context-window", type=int, default=8192, help="per slot")
    parser.add_argument("--engine-context", type=int, default=512, help="per slot, part A")
    parser.add_argument("--template", default="chatml")
    parser.add_argument("--n-gpu-layers", type=int, default=0, help="Kronk's meaning: 0 = all")
    parser.add_argument(
        "--llama-arg",
        action="append",
        default=[],
        help="extra argument for llama-batched-bench and llama-server, repeatable "
        "(e.g. --llama-arg=-nr where llama.cpp's tools die with SIGILL on AMX CPUs)",
    )
    parser.add_argument(
        "--switch-intervals",
        default="",
        help="part A again under each of these sys.setswitchinterval values (seconds, "
        "comma-separated): how much the engine thread waits for the GIL",
    )
    parser.add_argument(
        "--engine-variants",
        default="host,overlap,device,both",
        help=f"part A once per variant, comma-separated: {', '.join(VARIANTS)}",
    )
    parser.add_argument(
        "--llamacpp", type=json.loads, default={}, help="extra llamacpp keys for part A (JSON)"
    )
    parser.add_argument("--parts", default="a,b,c")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--work", type=Path, help="server logs and config [a new temp folder]")
    parser.add_argument("--smoke", action="store_true", help="tiny numbers: checks it end to end")
    args = parser.parse_args()
    args.streams = [int(s) for s in args.streams.split(",")]
    args.engine_variants = args.engine_variants.split(",")
    if unknown := set(args.engine_variants) - set(VARIANTS):
        parser.error(f"--engine-variants: unknown {', '.join(sorted(unknown))}")
    args.workloads, args.system_words, args.reply_tokens = [(1, 12), (4, 8)], 1000, 24
    if args.smoke:
        args.streams, args.tokens, args.prompt_words, args.context_window = [1, 2], 8, 16, 1024
        args.engine_context = 256
        args.workloads, args.system_words, args.reply_tokens = [(1, 2), (2, 2)], 60, 4
    parts = set(args.parts.split(","))
    report: dict[str, Any] = {
        "model": str(args.model),
        "args": {k: str(v) for k, v in vars(args).items()},
        "errors": {},
    }
    steps: list[tuple[str, str, Callable[[], Any]]] = [
        ("a", "batched_bench", lambda: batched_bench(args)),
        ("a", "engine", lambda: engine_variants(args)),
        ("b", "bare_tok_s", lambda: bare(args)),
    ]
    work = args.work or Path(tempfile.mkdtemp(prefix="kronk-bench-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    report["logs"] = str(work)  # the servers' logs stay there
    if args.switch_intervals:
        steps.append(("a", "switch", lambda: switch_intervals(args)))
    steps.append(("c", "servers", lambda: servers(args, work)))
    for part, key, step in steps:
        if part not in parts and not (part == "a" and "b" in parts and key == "engine"):
            continue
        try:
            report[key] = step()
        except Exception as exc:  # one failed part must not lose the others' numbers
            report["errors"][key] = f"{type(exc).__name__}: {exc}"
        if args.json:
            args.json.write_text(json.dumps(report, indent=1))
    print_report(report)
    print(f"server logs: {work}")
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
