"""Where an engine step goes, beside llama.cpp's own llama-batched-bench (issue 41, point 1).

For each packaged model and 1, 4 and 16 streams: every stream prefills a prompt of its own
(PROMPT tokens) and generates GENERATED tokens (end-of-generation tokens banned, greedy),
as llama-batched-bench's `-npp PROMPT -ntg GENERATED -npl 1,4,16` does. Printed side by side,
from one run:

- the generation phase's tokens per second, the engine's against batched-bench's S_TG (the
  same llama.cpp build, context size, batch sizes and threads; batched-bench decodes and
  samples nothing, so its figure is the ceiling);
- the engine's step split over that phase: the time inside `llama_decode`, and what the
  engine thread spent around it (building the batch, sampling, detokenizing and stop
  strings, handing text to the event loop, admission and cache bookkeeping, the loop).

Run: python bench/bench_step_split.py [--kv-unified|--kv-split]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from llama_server import llama_tool, no_amx_environment

from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_core.runtime.engine import Engine
from kronk_llamacpp.model import LlamaTextModel
from kronk_llamacpp.packaged import default_model_path, gemma_model_path

PROMPT = 128
GENERATED = 128
STREAMS = (1, 4, 16)
N_CTX = 8192  # batched-bench's -c: the whole KV, as the engine's slots x window
N_BATCH, N_UBATCH, THREADS = 2048, 512, 2

# What each timer wraps: (class, method, share name). The engine's methods nest; a share
# is what its method spent outside the methods timed beneath it.
TIMED: list[tuple[type, str, str]] = [
    (LlamaTextModel, "decode", "llama_decode"),
    (Engine, "_decode", "batch building"),
    (Engine, "_sample", "sampling"),
    (Engine, "_deliver", "detokenizing, stops"),
    (Engine, "_admit", "admission, cache"),
]


class Timers:
    """Seconds spent in each wrapped method, net of timed methods called inside it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._stack: list[list[float]] = []
        self.active = False

    def wrap(self, function: Callable[..., Any], name: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.active:
                return function(*args, **kwargs)
            self._stack.append([time.perf_counter(), 0.0])
            try:
                return function(*args, **kwargs)
            finally:
                began, nested = self._stack.pop()
                spent = time.perf_counter() - began
                self.seconds[name] += spent - nested
                if self._stack:
                    self._stack[-1][1] += spent

        return timed

    @contextmanager
    def installed(self) -> Iterator[None]:
        originals = [(cls, method, getattr(cls, method)) for cls, method, _ in TIMED]
        for cls, method, name in TIMED:
            setattr(cls, method, self.wrap(getattr(cls, method), name))
        try:
            yield
        finally:
            for cls, method, original in originals:
                setattr(cls, method, original)


def batched_bench(model: Path, kv_unified: bool) -> dict[int, float]:
    """llama-batched-bench's S_TG (generated tok/s) per stream count."""
    command = [
        str(llama_tool("llama-batched-bench")), "-m", str(model), "-c", str(N_CTX),
        "-b", str(N_BATCH), "-ub", str(N_UBATCH), "-t", str(THREADS),
        "-npp", str(PROMPT), "-ntg", str(GENERATED), "-npl", ",".join(map(str, STREAMS)),
        "--output-format", "jsonl", "-kvu" if kv_unified else "-no-kvu",
    ]  # fmt: skip
    environment = no_amx_environment()
    done = subprocess.run(command, capture_output=True, text=True, env=environment, check=True)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {int(row["pl"]): float(row["speed_tg"]) for row in rows}


async def engine_phase(kronk: Kronk, streams: int, timers: Timers) -> tuple[float, float]:
    """Generated tok/s from the moment every stream has its first token, and that phase's
    seconds; `timers` count only then."""
    loaded = kronk.load("m")
    ends = [t for t in range(loaded.info.n_vocab) if loaded.model.is_end_of_generation(t)]
    ban = dict.fromkeys(ends, -100.0)
    started: list[float] = []
    produced = [0] * streams

    async def one(stream: int) -> None:
        prompt = [1000 + (stream * 7919 + i * 104729) % 20000 for i in range(PROMPT)]
        async for delta in kronk.complete_stream(
            prompt, model="m", max_tokens=GENERATED, temperature=0, logit_bias=ban
        ):
            if delta.content and not produced[stream]:
                produced[stream] = 1
                if sum(produced) == streams:  # the last stream's first token: all generate
                    timers.seconds.clear()
                    timers.active = True
                    started.append(time.perf_counter())

    await asyncio.gather(*(one(stream) for stream in range(streams)))
    timers.active = False
    seconds = time.perf_counter() - started[0]
    return streams * (GENERATED - 1) / seconds, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kv-split", action="store_true", help="one KV stream per slot")
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="batched-bench then the engine, this many times in turn; prints each, then the "
        "median ratio (a round of each side next to the other, as the machine drifts)",
    )  # fmt: skip
    parser.add_argument("--models", default="smollm2,gemma", help="of smollm2,gemma")
    args = parser.parse_args()
    unified = not args.kv_split
    timers = Timers()
    models = {"smollm2": ("SmolLM2-135M", default_model_path()),
              "gemma": ("Gemma 3 270M", gemma_model_path())}  # fmt: skip
    for key in args.models.split(","):
        name, path = models[key]
        ratios: dict[int, list[float]] = {streams: [] for streams in STREAMS}
        for round_ in range(args.rounds):
            one_round(name, path, unified, timers, ratios, f" (round {round_ + 1})")
        if args.rounds > 1:
            medians = ", ".join(
                f"{streams}: {statistics.median(values):.2f}x" for streams, values in ratios.items()
            )
            print(f"{name}: median engine / batched-bench over {args.rounds} rounds: {medians}")


def one_round(
    name: str, path: Path, unified: bool, timers: Timers, ratios: dict[int, list[float]], tag: str
) -> None:
    reference = batched_bench(path, unified)
    print(f"\n{name}, KV {'unified' if unified else 'one stream per slot'}{tag}")
    print(
        f"{'streams':<9}{'batched-bench':>14}{'engine':>9}{'ratio':>7}  "
        + "  ".join(f"{share:>20}" for _, _, share in TIMED)
        + f"{'rest of the step loop':>23}"
    )
    for streams in STREAMS:
        config = ModelConfig.model_validate(
            {
                "model_path": path,
                "context_window": N_CTX // streams,
                "n_seq_max": streams,
                "n_batch": N_BATCH,
                "cache": "none",
                "draft_strategy": "none",
                "sampling": {"dry_multiplier": 0.0},
                "llamacpp": {
                    "n_ubatch": N_UBATCH,
                    "n_threads": THREADS,
                    "kv_unified": unified,
                },
            }
        )
        base = Path(tempfile.mkdtemp(prefix="kronk-step-split-"))
        kronk = Kronk(KronkConfig(base_path=base, models={"m": config}))
        with kronk, timers.installed():
            asyncio.run(engine_phase(kronk, streams, timers))  # warm-up, as batched-bench's
            rate, seconds = asyncio.run(engine_phase(kronk, streams, timers))
        shares = [timers.seconds[share] / seconds for _, _, share in TIMED]
        rest = 1 - sum(shares)
        ratio = rate / reference[streams]
        ratios[streams].append(ratio)
        print(
            f"{streams:<9}{reference[streams]:>14.1f}{rate:>9.1f}{ratio:>6.2f}x  "
            + "  ".join(f"{share:>19.1%} " for share in shares)
            + f"{rest:>22.1%}"
        )


if __name__ == "__main__":
    main()
