"""Decode speed of one model while another is loaded and computes on another thread.

Kronk runs each loaded model's engine on a thread of its own. llama.cpp built with OpenMP
keeps a worker pool per computing thread, and once the workers outnumber the cores every
pool stops spin-waiting between a decode's parallel steps; so models wholly on the CPU
compute on one shared thread (kronk_llamacpp/compute.py, docs/model-pool.md). This
prints four greedy streams' decode rate of model A: alone on the main thread, then on a
thread of its own while model B's thread, which decoded before, waits for work (as two
engines in one server), and on the main thread again. All four should match; before the
shared thread, the two in between ran a third slower.
"""

from __future__ import annotations

import random
import threading
import time

import kronk_llamacpp  # noqa: F401  (llama.cpp's libraries before numpy's)
from kronk_core.contract.backend import Batch
from kronk_core.settings.config import ModelConfig
from kronk_llamacpp.model import LlamaTextModel
from kronk_llamacpp.packaged import gemma_model_path

STREAMS, PROMPT, STEPS = 4, 200, 100


def load() -> LlamaTextModel:
    config = {"model_path": gemma_model_path(), "context_window": 8192, "n_seq_max": STREAMS}
    return LlamaTextModel(ModelConfig.model_validate(config))


def decode_rate(model: LlamaTextModel, label: str) -> None:
    rng = random.Random(0)
    batch = Batch()
    for seq in range(STREAMS):
        model.seq_remove(seq, 0, -1)
        for position in range(PROMPT):
            batch.add(rng.randrange(1000, 9000), position, seq, position == PROMPT - 1)
    model.decode(batch)
    began = time.perf_counter()
    for step in range(STEPS):
        batch = Batch()
        for seq in range(STREAMS):
            batch.add(rng.randrange(1000, 9000), PROMPT + step, seq, True)
        model.decode(batch)
    print(f"{label:<48}{STREAMS * STEPS / (time.perf_counter() - began):8.1f} tok/s", flush=True)


def main() -> None:
    a = load()
    decode_rate(a, "A alone, main thread")
    b = load()
    decoded, done = threading.Event(), threading.Event()

    def serve_b() -> None:  # as B's engine thread: it decodes, then stays for more work
        decode_rate(b, "B on a thread of its own")
        decoded.set()
        done.wait()

    b_engine = threading.Thread(target=serve_b)
    b_engine.start()
    decoded.wait()
    a_engine = threading.Thread(target=decode_rate, args=(a, "A on a thread of its own, B's idle"))
    a_engine.start()
    a_engine.join()
    done.set()
    b_engine.join()
    decode_rate(a, "A on the main thread again")
    a.close()
    b.close()


if __name__ == "__main__":
    main()
