"""Speculation on a sliding-window model when a decode is placed in pieces.

llama.cpp places a decode larger than n_ubatch in pieces, and while it looks for cells for
a piece it reuses a cell whose position has left its sequence's window, judged by the
newest position the sequence has then. A drafted sequence placed in an earlier piece has
its newest position past its drafts, so a later piece (another slot's prompt) could take
window cells the sequence needs once its rejected drafts are cut: the cut was no longer
exact, the request failed and speculation went off for the model (the fleet benchmark met
it). A step with drafts is now one piece.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kronk_core import FinishReason, Kronk, KronkConfig, ModelConfig
from kronk_core.contract.backend import Batch
from kronk_core.runtime.reports import StepRecord
from kronk_llamacpp.model import LlamaTextModel

WINDOW_MODEL: dict[str, Any] = {
    "templates": {"template": "gemma"},
    "context_window": 4096,
    "n_seq_max": 4,
    "n_batch": 512,
    "sampling": {"dry_multiplier": 0.0},
    "cache": "none",
    "draft_strategy": "lookup",
    "speculative": {"adaptive": False},
    # Small pieces: a step with a prompt chunk beside the drafts is placed in several.
    "llamacpp": {"n_ubatch": 64},
}


def cut_floors(gemma_path: str, n_ubatch: int) -> list[tuple[int, int]]:
    """(trim floor, cut point) of a drafted sequence after each of 30 decodes that place its
    pending token and 4 drafts first, then three other sequences' prompt chunks."""
    config = ModelConfig.model_validate(
        {
            "id": "m",
            "model_path": gemma_path,
            "context_window": 2048,
            "n_seq_max": 4,
            "n_batch": 2048,
            "llamacpp": {"n_ubatch": n_ubatch},
        }
    )
    model = LlamaTextModel(config)
    text = "hello world, the quick brown fox " * 400
    tokens = model.tokenize(text, add_special=False, parse_special=False)

    def decode(parts: list[tuple[int, int, int]]) -> None:
        batch = Batch()
        for seq, start, count in parts:
            for position in range(start, start + count):
                batch.add(tokens[position], position, seq, False)
        model.decode(batch)

    floors = []
    try:
        length = 900  # past the 512-token window
        decode([(0, 0, 512)])
        decode([(0, 512, length - 512)])
        for seq in (1, 2, 3):
            decode([(seq, 0, 300)])
        for step in range(12):  # in pieces, the floor passes the cut from the 6th step
            decode([(0, length, 5), *((seq, 300 + step * 50, 50) for seq in (1, 2, 3))])
            floors.append((model.trim_floor(0), length + 1))
            model.seq_remove(0, length + 1, -1)  # every draft rejected: the pending token stays
            length += 1
    finally:
        model.close()
    return floors


def test_a_decode_in_pieces_takes_window_cells_a_drafted_sequence_needs(gemma_path: str) -> None:
    """The llama.cpp behaviour the engine works around, and that one piece avoids."""
    in_pieces = cut_floors(gemma_path, n_ubatch=64)
    assert any(floor > keep for floor, keep in in_pieces), in_pieces
    in_one = cut_floors(gemma_path, n_ubatch=2048)
    assert all(floor <= keep for floor, keep in in_one), in_one


def repeat_request(name: str, functions: int) -> list[dict[str, str]]:
    lines = []
    for index in range(1, functions + 1):
        lines += [f"def {name}_{index}(values):", f"    return sum(values) * {index}", ""]
    code = "\n".join(lines)
    text = f"Here is a Python file:\n\n```python\n{code}\n```\n\nRepeat the whole file exactly."
    return [{"role": "user", "content": text}]


async def test_drafting_beside_prompts_keeps_every_cut_exact(
    tmp_path: Path, gemma_path: str
) -> None:
    """One slot speculates through a conversation longer than the window while three
    others prefill long prompts: no step with drafts is placed in pieces, prompts are still
    read in full-size steps, every request ends normally, and speculation stays on."""
    model = ModelConfig.model_validate({"model_path": gemma_path, **WINDOW_MODEL})
    with Kronk(KronkConfig(base_path=tmp_path, models={"m": model})) as kronk:
        steps: list[StepRecord] = []
        kronk.load("m").engine.add_step_listener(steps.append)
        drafted = await kronk.start_chat(
            kronk.chat_request(
                repeat_request("alpha", 40), model="m", max_tokens=160, temperature=0
            )
        )
        stream = aiter(drafted)
        await anext(stream)  # it generates: the others' prompts now share its steps
        others = [
            kronk.chat(repeat_request(name, 60), model="m", max_tokens=4, temperature=0)
            for name in ("beta", "gamma", "delta")
        ]
        answers = await asyncio.gather(*others)
        last = [delta async for delta in stream][-1]  # a failed cut raises here
        assert all(answer.finish_reason is FinishReason.length for answer in answers)
        assert last.finish_reason in (FinishReason.length, FinishReason.stop), last
        assert last.usage is not None and last.usage.accepted_prediction_tokens > 0
        n_ubatch = WINDOW_MODEL["llamacpp"]["n_ubatch"]
        with_drafts = [step for step in steps if any(n > 1 for n in step.generating.values())]
        sizes = [sum(step.generating.values()) + sum(step.prefilling.values()) for step in steps]
        assert with_drafts and all(
            sum(step.generating.values()) + sum(step.prefilling.values()) <= n_ubatch
            for step in with_drafts
        )
        assert max(sizes) > n_ubatch  # the prompts' steps were as large as ever
        again = await kronk.chat(
            repeat_request("alpha", 40), model="m", max_tokens=60, temperature=0
        )
        assert again.usage.accepted_prediction_tokens > 0  # speculation is still on
