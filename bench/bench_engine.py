"""Engine benchmark: overhead against a bare llama_decode loop, and batching throughput.

Everything is measured side by side in one run on the default model:
  1. single-stream decode tok/s: bare llama.cpp loop vs the Kronk engine (target overhead ≤ 5%);
  2. aggregate decode tok/s at 1/2/4/8 concurrent streams (target at 8: ≥ 2x one stream);
  3. sampled decode (temperature 0.8, the default chain) at 1 and 8 streams: top-k's chain
     run on a shortlist against the same chain on the whole vocabulary. Both draw the same
     tokens from the same logits (same seeds), so only the sampler's cost differs; the
     tokens produced are printed for both.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import llama_cpp

from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_llamacpp.library import ensure_initialised
from kronk_llamacpp.packaged import GEMMA_MODEL_ID, gemma_model_path
from kronk_llamacpp.params import context_params, model_params
from kronk_llamacpp.sampler import ShortlistTopKSampler

PROMPT = (
    "<bos><start_of_turn>user\nCount from 1 upwards, one number a line.<end_of_turn>\n"
    "<start_of_turn>model\n"
)


def bare_loop(config: ModelConfig, tokens: int) -> float:
    """Greedy decode with nothing but llama.cpp calls; returns tok/s including the prefill.

    Same context as the engine's (context_window x n_seq_max, the same KV layout) and the
    same warm-up (one short generation first), so only the loop around the
    calls differs.
    """
    ensure_initialised()
    model = llama_cpp.llama_model_load_from_file(
        str(config.model_path).encode(), model_params(config)
    )
    ctx = llama_cpp.llama_init_from_model(
        model, context_params(config, model, config.context_window or 2048)
    )
    _greedy(ctx, model, 16)
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    rate = _greedy(ctx, model, tokens)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return rate


def _greedy(ctx: llama_cpp.llama_context_p, model: llama_cpp.llama_model_p, tokens: int) -> float:
    vocab = llama_cpp.llama_model_get_vocab(model)
    data = PROMPT.encode()
    buffer = (llama_cpp.llama_token * 512)()
    count = llama_cpp.llama_tokenize(vocab, data, len(data), buffer, 512, False, True)
    batch = llama_cpp.llama_batch_init(512, 0, 1)
    for i in range(count):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = buffer[i], i, 1
        batch.seq_id[i][0], batch.logits[i] = 0, i == count - 1
    batch.n_tokens = count
    started = time.perf_counter()
    llama_cpp.llama_decode(ctx, batch)
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    index, position = count - 1, count
    for _ in range(tokens):
        token = llama_cpp.llama_sampler_sample(chain, ctx, index)
        batch.token[0], batch.pos[0], batch.n_seq_id[0] = token, position, 1
        batch.seq_id[0][0], batch.logits[0] = 0, True
        batch.n_tokens = 1
        llama_cpp.llama_decode(ctx, batch)
        index, position = 0, position + 1
    elapsed = time.perf_counter() - started
    llama_cpp.llama_sampler_free(chain)
    llama_cpp.llama_batch_free(batch)
    return tokens / elapsed


GREEDY = {"temperature": 0, "dry_multiplier": 0}


async def engine_streams(
    kronk: Kronk, streams: int, tokens: int, sampling: dict[str, float] = GREEDY
) -> tuple[float, int]:
    """Aggregate tok/s of `streams` concurrent generations (short prompts, streamed), and
    the tokens they produced."""

    async def one(i: int) -> int:
        messages = [{"role": "user", "content": f"Count from {i + 1} upwards, one number a line."}]
        produced = 0
        async for delta in kronk.chat_stream(messages, max_tokens=tokens, seed=i, **sampling):
            if delta.usage is not None:
                produced = delta.usage.completion_tokens
        return produced

    began = time.perf_counter()
    total = sum(await asyncio.gather(*(one(i) for i in range(streams))))
    return total / (time.perf_counter() - began), total


def sampled_decode(kronk: Kronk, tokens: int) -> None:
    print(
        f"\n{'sampled decode (T 0.8)':<24}{'whole vocab':>12}{'shortlist':>12}{'ratio':>8}"
        f"{'tokens':>14}"
    )
    shortlist = ShortlistTopKSampler.MARGINS
    for streams in (1, 8):
        rates = {}
        for name, margins in (("whole", ()), ("shortlist", shortlist)):
            ShortlistTopKSampler.MARGINS = margins  # no margin: the whole vocabulary, always
            rates[name] = asyncio.run(engine_streams(kronk, streams, tokens, {"temperature": 0.8}))
        ShortlistTopKSampler.MARGINS = shortlist
        (whole, produced), (fast, same) = rates["whole"], rates["shortlist"]
        print(
            f"{f'{streams} stream(s)':<24}{whole:>12.1f}{fast:>12.1f}{fast / whole:>7.2f}x"
            f"{f'{produced} / {same}':>14}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=200)
    args = parser.parse_args()
    config = ModelConfig.model_validate(
        {
            "id": GEMMA_MODEL_ID,
            "model_path": gemma_model_path(),
            "templates": {"template": "gemma"},
            "context_window": 2048,
            "n_seq_max": 8,
            # The engine's own cost per token, against a loop that decodes one token a step.
            "draft_strategy": "none",
        }
    )
    # Its own process: llama.cpp's CPU thread pool belongs to the thread that first
    # decodes, and a second pool in the same process (the engine thread's) then
    # competes with the first one's idle workers.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        bare = pool.submit(bare_loop, config, args.tokens)
        bare_rate = bare.result()
    kronk = Kronk(KronkConfig(default_model=GEMMA_MODEL_ID, models={GEMMA_MODEL_ID: config}))
    kronk.load()
    asyncio.run(engine_streams(kronk, 1, 16))  # warm-up
    single, _ = asyncio.run(engine_streams(kronk, 1, args.tokens))
    print(f"\n{'single stream decode':<34}{'tok/s':>10}")
    print(f"{'bare llama_decode loop':<34}{bare_rate:>10.1f}")
    print(f"{'kronk engine':<34}{single:>10.1f}")
    print(f"{'engine overhead':<34}{(1 - single / bare_rate) * 100:>9.1f}%  (target <= 5%)")
    print(f"\n{'concurrent streams':<20}{'aggregate tok/s':>16}{'x single':>10}")
    base = 0.0
    for streams in (1, 2, 4, 8):
        rate, _ = asyncio.run(engine_streams(kronk, streams, args.tokens))
        base = base or rate
        print(f"{streams:<20}{rate:>16.1f}{rate / base:>10.2f}")
    print("target at 8 streams: >= 2.00x")
    sampled_decode(kronk, args.tokens)
    kronk.close()


if __name__ == "__main__":
    main()
