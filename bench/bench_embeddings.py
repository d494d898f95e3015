"""Embedding throughput: a pool of 1 context against a pool of 2, side by side in one run.

The model is the real all-MiniLM-L6-v2 (converted by scripts/convert_minilm.py);
the work is 1,000 short sentences, sent two ways:
  1. one request holding all of them (spread over the contexts, batched in each);
  2. 100 concurrent requests of 10 (many clients at once).
Each context gets cpu_count / contexts threads (the default), so both pools use
the same cores; the ratio shows what running contexts side by side buys.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_testing.models.minilm import minilm_gguf
from kronk_testing.models.output import default_out_dir

SUBJECTS = ["The cat", "A scientist", "My neighbour", "The old train", "Our team", "The river"]
VERBS = ["watches", "builds", "forgets", "paints", "follows", "measures"]
OBJECTS = ["the sunrise", "a small boat", "the evening news", "a red kite", "the long road"]
SENTENCES = [
    f"{SUBJECTS[i % 6]} {VERBS[(i // 6) % 6]} {OBJECTS[(i // 36) % 5]} on day {i}."
    for i in range(1000)
]
ROUNDS = 3


async def _one_request(kronk: Kronk) -> float:
    started = time.perf_counter()
    await kronk.embed(SENTENCES, model="minilm")
    return len(SENTENCES) / (time.perf_counter() - started)


async def _many_requests(kronk: Kronk) -> float:
    started = time.perf_counter()
    chunks = [SENTENCES[i : i + 10] for i in range(0, len(SENTENCES), 10)]
    await asyncio.gather(*(kronk.embed(chunk, model="minilm") for chunk in chunks))
    return len(SENTENCES) / (time.perf_counter() - started)


async def _measure(path: Path, contexts: int) -> tuple[float, float]:
    config = KronkConfig(
        base_path=Path(tempfile.mkdtemp()),
        models={"minilm": ModelConfig(model_path=path, n_seq_max=contexts)},
    )
    with Kronk(config) as kronk:
        await kronk.embed("warm up", model="minilm")
        one = max([await _one_request(kronk) for _ in range(ROUNDS)])
        many = max([await _many_requests(kronk) for _ in range(ROUNDS)])
    return one, many


async def main() -> None:
    path = minilm_gguf(default_out_dir())
    single = await _measure(path, 1)
    double = await _measure(path, 2)
    print(f"all-MiniLM-L6-v2, {len(SENTENCES)} sentences, best of {ROUNDS}")
    print(f"{'':28}{'pool 1':>12}{'pool 2':>12}{'ratio':>8}")
    for label, a, b in zip(
        ("one request of 1000 (emb/s)", "100 requests of 10 (emb/s)"), single, double, strict=True
    ):
        print(f"{label:28}{a:12.0f}{b:12.0f}{b / a:8.2f}")


if __name__ == "__main__":
    asyncio.run(main())
