"""RoPE scaling derived from the extension ratio, as the manual's chapter 6 promises:
`rope_scaling: yarn` with a window past the training length is all a user writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_llamacpp.params import RopeScale, rope_scale
from kronk_llamacpp.settings import LlamaCppSettings


@pytest.mark.parametrize(
    ("settings", "window", "expected"),
    [
        ({"rope_scaling": "yarn"}, 1024, RopeScale(0.25, 256)),  # 4x: a quarter, trained 256
        ({"rope_scaling": "yarn"}, 256, RopeScale(None, 256)),  # within the training length
        ({"rope_scaling": "linear"}, 512, RopeScale(0.5, None)),
        ({"rope_scaling": "yarn", "yarn_orig_ctx": 128}, 512, RopeScale(0.25, 128)),
        ({"rope_scaling": "yarn", "rope_freq_scale": 0.4}, 1024, RopeScale(0.4, 256)),
        ({"rope_freq_scale": 0.5}, 1024, RopeScale(0.5, None)),  # none: only what is set
        ({}, 1024, RopeScale(None, None)),
    ],
)
def test_the_scale_follows_the_extension_ratio(
    settings: dict[str, Any], window: int, expected: RopeScale
) -> None:
    assert rope_scale(LlamaCppSettings.model_validate(settings), window, 256) == expected


def _entry(path: Path, **llamacpp: Any) -> ModelConfig:
    return ModelConfig.model_validate(
        {"model_path": path, "context_window": 1024, "n_seq_max": 1, "llamacpp": llamacpp}
    )


async def test_a_derived_yarn_runs_as_the_same_parameters_written_out(
    tmp_path: Path, tiny_llama_path: Path
) -> None:
    """The tiny model is trained at 256 tokens: a 1024-token window with `rope_scaling: yarn`
    computes what `rope_freq_scale: 0.25, yarn_orig_ctx: 256` computes, and not what an
    unscaled (or merely YaRN-flagged) model computes."""
    models = {
        "derived": _entry(tiny_llama_path, rope_scaling="yarn"),
        "written": _entry(
            tiny_llama_path, rope_scaling="yarn", rope_freq_scale=0.25, yarn_orig_ctx=256
        ),
        "unscaled": _entry(tiny_llama_path),
        "flagged": _entry(tiny_llama_path, rope_scaling="yarn", rope_freq_scale=1.0),
    }
    prompt = "one two three four five six seven eight nine ten " * 4
    answers = {}
    with Kronk(KronkConfig(base_path=tmp_path, models_in_cache=1, models=models)) as kronk:
        for model_id in models:
            result = await kronk.complete(
                prompt, model=model_id, max_tokens=4, temperature=0, logprobs=True
            )
            answers[model_id] = [round(entry.logprob, 4) for entry in result.logprobs]
    assert answers["derived"] == answers["written"]
    assert answers["derived"] != answers["unscaled"]
    assert answers["derived"] != answers["flagged"]
