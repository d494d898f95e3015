"""Message-caching benchmark: agent workloads with no cache, SPC and IMC, side by side.

W1  one agent, 12 turns (~1,000-token system prompt, ~200-token tool results, short greedy
    replies): time to first token per turn for none / SPC / IMC, and the time to prefill
    only turn 12's new tokens (target: IMC within 1.25x of it; IMC >= 8x faster than none).
W2  four agents at once, 8 turns each: wall time and total TTFT per mode.
W3  sixteen agents taking turns on four slots: total TTFT with and without the host tier
    (target: >= 3x lower with it).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_core.contract.backend import Batch
from kronk_core.contract.sampling import Greedy
from kronk_llamacpp.model import LlamaTextModel
from kronk_llamacpp.packaged import gemma_model_path

Messages = list[dict[str, str]]


def system_prompt(agent: int, words: int) -> str:
    rules = " ".join(
        f"Rule {n}: when the user asks about module {n * 7 + agent}, read it before editing."
        for n in range(words // 14)
    )
    return f"You are coding agent number {agent}. Follow the project rules. {rules}"


def tool_result(agent: int, turn: int) -> str:
    lines = [
        f"src/pkg_{agent}/module_{turn}_{i}.py: {40 + i * 3} lines, {i} functions, ok"
        for i in range(8)
    ]
    return "Tool result (list_files):\n" + "\n".join(lines)


async def turn(kronk: Kronk, model: str, messages: Messages) -> tuple[float, str]:
    """Send the conversation; returns (time to first token, reply)."""
    started = time.perf_counter()
    first = 0.0
    parts: list[str] = []
    async for delta in kronk.chat_stream(messages, model=model, max_tokens=16, temperature=0):
        if not first and (delta.content or delta.finish_reason):
            first = time.perf_counter() - started
        parts.append(delta.content)
    return first, "".join(parts)


async def agent(kronk: Kronk, model: str, index: int, turns: int, words: int) -> list[float]:
    messages: Messages = [{"role": "system", "content": system_prompt(index, words)}]
    ttfts = []
    for number in range(turns):
        messages.append({"role": "user", "content": tool_result(index, number)})
        ttft, reply = await turn(kronk, model, messages)
        ttfts.append(ttft)
        messages.append({"role": "assistant", "content": reply})
    return ttfts


def prefill_only_new_tokens(path: Path, kronk: Kronk, model: str, turns: int, words: int) -> float:
    """Seconds to prefill just the last turn's new tokens onto a KV that holds the rest."""
    loaded = kronk.load(model)
    messages: Messages = [{"role": "system", "content": system_prompt(0, words)}]
    for number in range(turns):
        messages.append({"role": "user", "content": tool_result(0, number)})
        if number < turns - 1:
            messages.append({"role": "assistant", "content": "ok"})
    request = kronk.chat_request(messages)
    full = loaded.render(request.messages, kronk.render_options(request))
    before = loaded.render(request.messages[:-1], kronk.render_options(request))
    shared = next(i for i, (a, b) in enumerate(zip(before, full, strict=False)) if a != b)
    reference = LlamaTextModel(ModelConfig(model_path=path, context_window=8192, n_seq_max=1))
    sampler = reference.new_sampler([Greedy()])
    try:
        for start in range(0, shared, 2048):
            reference.decode(_chunk(full, start, min(start + 2048, shared)))
        began = time.perf_counter()
        new_tokens = _chunk(full, shared, len(full))
        reference.decode(new_tokens)
        sampler.sample(len(new_tokens) - 1)
        return time.perf_counter() - began
    finally:
        sampler.close()
        reference.close()


def _chunk(tokens: list[int], start: int, end: int) -> Batch:
    batch = Batch()
    for position in range(start, end):
        batch.add(tokens[position], position, 0, position == end - 1)
    return batch


def config(path: Path, slots: int, **extra: Any) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "model_path": path,
            "templates": {"template": "gemma"},
            "context_window": 8192,
            "n_seq_max": slots,
            "sampling": {"dry_multiplier": 0.0},
            "draft_strategy": "none",  # the caches alone
            **extra,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--words", type=int, default=700, help="system prompt size in words")
    parser.add_argument("--w3-rounds", type=int, default=3)
    args = parser.parse_args()
    path = gemma_model_path()
    modes = {
        "none": {"cache": "none"},
        "spc": {"cache": "spc"},
        "imc": {"cache": "imc", "caching": {"host_cache_bytes": 0}},
    }
    models = {
        f"{mode}-{slots}": config(path, slots, **extra)
        for mode, extra in modes.items()
        for slots in (1, 4)
    }
    models["imc-host-4"] = config(path, 4, cache="imc", caching={"host_cache_bytes": 4 << 30})
    kronk = Kronk(KronkConfig(models=models))
    for name in models:  # load time must not count as time to first token
        kronk.load(name)
    asyncio.run(turn(kronk, "none-1", [{"role": "user", "content": "warm up"}]))

    print("\nW1: one agent, 12 turns — time to first token (s)")
    w1 = {mode: asyncio.run(agent(kronk, f"{mode}-1", 0, 12, args.words)) for mode in modes}
    print(f"{'turn':<6}" + "".join(f"{mode:>10}" for mode in modes))
    for number in range(12):
        print(f"{number + 1:<6}" + "".join(f"{w1[mode][number]:>10.3f}" for mode in modes))
    prefill = prefill_only_new_tokens(path, kronk, "none-1", 12, args.words)
    for name in list(models):
        if name.endswith("-1"):
            kronk.unload(name)
    print(f"prefill of turn 12's new tokens only: {prefill:.3f}s")
    print(f"IMC turn 12 / new-token prefill: {w1['imc'][11] / prefill:.2f}x (target <= 1.25x)")
    print(f"none / IMC on turn 12: {w1['none'][11] / w1['imc'][11]:.1f}x (target >= 8x)")

    print("\nW2: four agents at once, 8 turns each")
    print(f"{'mode':<8}{'wall s':>10}{'total TTFT s':>14}")
    for mode in modes:
        began = time.perf_counter()
        runs = asyncio.run(_gather(kronk, f"{mode}-4", range(4), 8, args.words))
        print(f"{mode:<8}{time.perf_counter() - began:>10.2f}{sum(map(sum, runs)):>14.2f}")

    print(f"\nW3: sixteen agents taking turns on four slots ({args.w3_rounds} rounds)")
    totals = {}
    for name in ("imc-4", "imc-host-4"):
        kronk.unload(name)  # start from empty slots
        totals[name] = asyncio.run(_rounds(kronk, name, 16, args.w3_rounds, args.words // 2))
        print(f"{name:<12} total TTFT {totals[name]:.2f}s")
    print(f"host tier: {totals['imc-4'] / totals['imc-host-4']:.1f}x lower (target >= 3x)")
    kronk.close()


async def _gather(kronk: Kronk, model: str, agents: range, turns: int, words: int) -> Any:
    return await asyncio.gather(*(agent(kronk, model, i, turns, words) for i in agents))


async def _rounds(kronk: Kronk, model: str, agents: int, rounds: int, words: int) -> float:
    conversations: list[Messages] = [
        [{"role": "system", "content": system_prompt(i, words)}] for i in range(agents)
    ]
    total = 0.0
    for number in range(rounds):
        for index, messages in enumerate(conversations):
            messages.append({"role": "user", "content": tool_result(index, number)})
            ttft, reply = await turn(kronk, model, messages)
            messages.append({"role": "assistant", "content": reply})
            if number:  # the first round builds every conversation in both modes
                total += ttft
    return total


if __name__ == "__main__":
    main()
