"""A slot the engine emptied behind IMC's back (its reset after a fault) keeps no checkpoint.

A checkpoint holds the window state of the conversation it was taken of. Restored under
another conversation that is in the slot later, it would put the old conversation's
window under the new one's tokens. The next prompt in the emptied slot is a rebuild,
which forgets the slot's checkpoints: this keeps it so.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from kronk_caching.plugin import incremental_cache
from kronk_core import ModelConfig
from kronk_core.contract.backend import Batch
from kronk_core.contract.cache import CacheStrategy, Slot
from kronk_core.contract.generation import GenerationRequest
from kronk_core.contract.types import SamplingParams
from kronk_llamacpp.model import LlamaTextModel
from kronk_llamacpp.packaged import GEMMA_MODEL_ID, gemma_model_path


@pytest.fixture(scope="module")
def model() -> Iterator[LlamaTextModel]:
    config = ModelConfig.model_validate(
        {"id": GEMMA_MODEL_ID, "model_path": gemma_model_path(), "context_window": 2048,
         "n_seq_max": 1, "caching": {"host_cache_bytes": 0}}
    )  # fmt: skip
    loaded = LlamaTextModel(config)
    yield loaded
    loaded.close()


def words(seed: int, count: int) -> str:
    return " ".join(f"w{(seed * 7919 + i * 104729) % 9973}" for i in range(count))


def run_prompt(
    strategy: CacheStrategy, slot: Slot, model: LlamaTextModel, prompt: Sequence[int]
) -> int:
    """What the engine does for a prompt: prepare, prefill the rest, tell the strategy."""
    request = GenerationRequest(prompt_tokens=tuple(prompt), sampling=SamplingParams())
    reused = strategy.prepare(slot, request, model, [slot]).reused
    for start in range(reused, len(prompt), 256):
        batch = Batch()
        chunk = prompt[start : start + 256]
        for position, token in enumerate(chunk, start):
            batch.add(token, position, slot.seq_id, position == len(prompt) - 1)
        model.decode(batch)
        slot.tokens.extend(chunk)
    strategy.prefilled(slot, model)
    return reused


def test_a_reset_slot_forgets_the_checkpoints_of_its_old_conversation(
    model: LlamaTextModel,
) -> None:
    assert not model.info.kv_trimmable  # Gemma 3's sliding window: IMC checkpoints
    config = ModelConfig.model_validate(
        {"id": GEMMA_MODEL_ID, "model_path": gemma_model_path()}
    )
    strategy = incremental_cache(model_config=config, model_info=model.info)
    slot = Slot(id=0, seq_id=0)
    old = model.tokenize(words(1, 100), add_special=True, parse_special=False)
    assert run_prompt(strategy, slot, model, old) == 0  # checkpoint at len(old)
    # The engine's reset after a fault: the KV and the slot's record emptied.
    model.seq_remove(slot.seq_id, 0, -1)
    slot.tokens.clear()
    new = model.tokenize(words(2, 260), add_special=True, parse_special=False)
    assert run_prompt(strategy, slot, model, new) == 0
    # A prompt that leaves `new` below its trim floor but past the old checkpoint's length.
    cut = len(old) + 100
    assert cut < model.trim_floor(slot.seq_id)
    edited = [*new[:cut], *model.tokenize(words(3, 10), add_special=False, parse_special=False)]
    assert run_prompt(strategy, slot, model, edited) == 0  # nothing of `old` restored
    assert strategy.counters().checkpoint_restores == 0
