"""Make LoRA adapters for the default model (SmolLM2, llama architecture): random low-rank
updates of its attention queries and feed-forward inputs, in the GGUF layout llama.cpp's
`convert_lora_to_gguf.py` writes, so that an adapter changes what the model answers.

Command line: python scripts/make_lora_adapters.py [--out DIR]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

from kronk_testing.models.output import gguf_writer

SMOLLM2_LORA = "smollm2-lora-a.gguf"
SMOLLM2_LORA_B = "smollm2-lora-b.gguf"
# Shaped for another model (its rows are not SmolLM2's): llama.cpp refuses it.
WRONG_SHAPE_LORA = "wrong-shape-lora.gguf"

RANK = 8


def _base_shape() -> tuple[int, int, int]:
    """SmolLM2's layers, embedding and feed-forward widths, from its file's header."""
    from kronk_llamacpp.gguf_meta import read_metadata
    from kronk_llamacpp.packaged import default_model_path

    meta = read_metadata(default_model_path())
    arch = meta["general.architecture"]
    width = meta[f"{arch}.embedding_length"]
    return meta[f"{arch}.block_count"], width, meta[f"{arch}.feed_forward_length"]


def make_lora(path: Path, seed: int = 0, *, width_off_by: int = 0) -> Path:
    """An adapter of rank RANK on every layer's attn_q and ffn_up (`width_off_by`: made for
    an embedding that many columns wider than SmolLM2's)."""
    layers, width, ffn = _base_shape()
    width += width_off_by
    rng = np.random.default_rng(seed)

    def pair(n_in: int, n_out: int) -> tuple[Any, Any]:
        # numpy's (rows, columns) is ggml's (ne1, ne0) reversed: lora_a is ggml's
        # [n_in, rank], lora_b [rank, n_out], as llama.cpp's loader checks.
        a = rng.normal(0.0, 1.0 / np.sqrt(n_in), (RANK, n_in)).astype(np.float32)
        b = rng.normal(0.0, 0.05, (n_out, RANK)).astype(np.float32)
        return a, b

    with gguf_writer(path, gguf.MODEL_ARCH.LLAMA, path.stem) as writer:
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(RANK))  # scale 1 is B @ A
        for layer in range(layers):
            for name, n_in, n_out in (("attn_q", width, width), ("ffn_up", width, ffn)):
                a, b = pair(n_in, n_out)
                writer.add_tensor(f"blk.{layer}.{name}.weight.lora_a", a)
                writer.add_tensor(f"blk.{layer}.{name}.weight.lora_b", b)
    return path


MAKERS = {
    SMOLLM2_LORA: lambda path: make_lora(path, seed=1),
    SMOLLM2_LORA_B: lambda path: make_lora(path, seed=2),
    WRONG_SHAPE_LORA: lambda path: make_lora(path, seed=3, width_off_by=64),
}
