"""A model object held past its unloading (`Kronk.close()`, the pool's eviction) refuses
every call into llama.cpp with EngineClosedError, where the call would read freed memory
and abort the process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kronk_core import Kronk, KronkConfig
from kronk_core.contract.backend import Batch
from kronk_core.contract.errors import EngineClosedError
from kronk_core.contract.media import Media, MediaKind
from kronk_core.contract.sampling import Greedy
from kronk_llamacpp.media import LlamaMediaModel
from kronk_testing.plugin import MultimodalPaths

pytestmark = pytest.mark.model

def calls(model: LlamaMediaModel) -> dict[str, Callable[[], Any]]:
    batch = Batch()
    batch.add(5, 0, 0, True)
    image = Media(MediaKind.image, b"png", "image/png")
    return {
        "tokenize": lambda: model.tokenize("hi", add_special=True, parse_special=True),
        "token_bytes": lambda: model.token_bytes(5),
        "token_text": lambda: model.token_text(5),
        "is_end_of_generation": lambda: model.is_end_of_generation(1),
        "decode": lambda: model.decode(batch),
        "synchronize": model.synchronize,
        "logprobs": lambda: model.logprobs(0, 5, 1),
        "compile_stages": lambda: model.compile_stages([Greedy()]),
        "new_sampler": lambda: model.new_sampler([Greedy()]),
        "seq_remove": lambda: model.seq_remove(0, 0, -1),
        "seq_copy": lambda: model.seq_copy(0, 1, 0, -1),
        "seq_shift": lambda: model.seq_shift(0, 0, -1, -1),
        "seq_state": lambda: model.seq_state(0),
        "set_seq_state": lambda: model.set_seq_state(0, b"state"),
        "trim_floor": lambda: model.trim_floor(0),
        "checkpoint": lambda: model.checkpoint(0),
        "restore_checkpoint": lambda: model.restore_checkpoint(0, 0, b""),
        "tokenize_media": lambda: model.tokenize_media(["a", image]),
    }


def test_every_call_into_llama_cpp_on_a_closed_model_is_refused(
    tmp_path: Path, multimodal_paths: MultimodalPaths
) -> None:
    entry = {
        "model_path": multimodal_paths.model,
        "projector_path": multimodal_paths.vision,
        "context_window": 128,
        "n_seq_max": 2,
    }
    kronk = Kronk(KronkConfig(base_path=tmp_path, models={"m": entry}))
    loaded = kronk.load("m")
    model = loaded.model
    assert isinstance(model, LlamaMediaModel)
    assert model.tokenize("hi", add_special=False, parse_special=True)
    kronk.close()
    answered = []
    for name, call in calls(model).items():
        try:
            call()
        except EngineClosedError as refused:
            assert refused.message == "the model m was unloaded", name
        else:
            answered.append(name)
    assert answered == []
    with pytest.raises(EngineClosedError):
        loaded.prompt("hello")  # what a server's request renders through
