"""The greedy fast path reads the argmax in place; it must pick llama.cpp's greedy token."""

from __future__ import annotations

from collections.abc import Iterator

import llama_cpp
import pytest

from kronk_core import DEFAULT_MODEL_ID, ModelConfig
from kronk_core.backend import Batch
from kronk_core.models import default_model_path
from kronk_core.sampling import Greedy
from kronk_llamacpp.model import LlamaTextModel
from kronk_llamacpp.sampler import GreedySampler, NativeSampler

TEXT = (
    "The quick brown fox jumps over the lazy dog. In 1492 Columbus sailed the ocean blue; "
    "def add(a, b):\n    return a + b\n"
)


@pytest.fixture(scope="module")
def model() -> Iterator[LlamaTextModel]:
    config = ModelConfig.model_validate(
        {
            "id": DEFAULT_MODEL_ID,
            "model_path": default_model_path(),
            "context_window": 256,
            "n_seq_max": 1,
        }
    )
    loaded = LlamaTextModel(config)
    yield loaded
    loaded.close()


def test_greedy_alone_takes_the_fast_path_and_matches_llama_cpp_at_every_position(
    model: LlamaTextModel,
) -> None:
    tokens = model.tokenize(TEXT, add_special=True, parse_special=False)
    batch = Batch()
    for position, token in enumerate(tokens):
        batch.add(token, position, 0, True)
    model.decode(batch)
    fast = model.new_sampler([Greedy()])
    assert isinstance(fast, GreedySampler)
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    native = NativeSampler(model._ctx, chain)
    try:
        picked = [fast.sample(index) for index in range(len(tokens))]
        assert picked == [native.sample(index) for index in range(len(tokens))]
        assert len(set(picked)) > 5  # many different distributions, not one repeated case
    finally:
        native.close()
        fast.close()
