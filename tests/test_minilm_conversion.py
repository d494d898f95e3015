"""scripts/convert_minilm.py against the original checkpoint.

Reference: a plain numpy forward pass of BERT over the checkpoint's own
safetensors weights, tokenized by the checkpoint's own tokenizer.json (HF
`tokenizers`), mean-pooled and normalised as sentence-transformers does.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from kronk_core import Kronk

SENTENCES = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "Kronk serves GGUF models locally; naïve café accents are folded.",
    "embeddings're great, aren't they?",
]

Array = np.ndarray[Any, np.dtype[np.float64]]


def _layer_norm(x: Array, weight: Array, bias: Array) -> Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-12) * weight + bias


def _reference(weights: dict[str, Array], ids: list[int]) -> Array:
    n = len(ids)
    w = weights
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][:n]
        + w["embeddings.token_type_embeddings.weight"][0]
    )
    x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
    erf = np.vectorize(math.erf)
    for layer in range(6):
        p = f"encoder.layer.{layer}."

        def linear(h: Array, name: str, p: str = p) -> Array:
            return h @ w[p + name + ".weight"].T + w[p + name + ".bias"]

        q, k, v = (
            linear(x, f"attention.self.{name}").reshape(n, 12, 32).transpose(1, 0, 2)
            for name in ("query", "key", "value")
        )
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(32)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        attended = (scores @ v).transpose(1, 0, 2).reshape(n, 384)
        x = _layer_norm(
            x + linear(attended, "attention.output.dense"),
            w[p + "attention.output.LayerNorm.weight"],
            w[p + "attention.output.LayerNorm.bias"],
        )
        hidden = linear(x, "intermediate.dense")
        hidden = 0.5 * hidden * (1 + erf(hidden / math.sqrt(2)))
        x = _layer_norm(
            x + linear(hidden, "output.dense"),
            w[p + "output.LayerNorm.weight"],
            w[p + "output.LayerNorm.bias"],
        )
    pooled: Array = x.mean(0)
    return pooled / np.linalg.norm(pooled)


async def test_converted_minilm_matches_the_checkpoint(kronk: Kronk, minilm_path: Path) -> None:
    checkpoint = minilm_path.parent / "all-MiniLM-L6-v2"
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    tokenizer.no_padding()
    weights = {
        k: v.astype(np.float64) for k, v in load_file(checkpoint / "model.safetensors").items()
    }
    model = kronk.load("minilm").model
    for sentence in SENTENCES:
        ids = tokenizer.encode(sentence).ids
        assert model.tokenize(sentence, add_special=True, parse_special=False) == ids
        ours = np.array((await kronk.embed(sentence, model="minilm")).vectors[0])
        assert float(ours @ _reference(weights, ids)) > 0.9999  # f16 weights: ~0.99999 seen
