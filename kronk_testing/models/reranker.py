"""Generate a tiny cross-encoder reranker GGUF for tests (run once; the output is cached).

A 2-layer BERT with deterministic random weights, a classification head
(`cls`, `cls.output`: one relevance logit) and rank pooling, over the real
all-MiniLM-L6-v2 WordPiece vocabulary. Its scores mean nothing, but it goes
through llama.cpp exactly like a real reranker: pair formatting, rank pooling,
one score per (query, document).

Command line: python scripts/make_tiny_reranker.py [--out DIR]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

from kronk_testing.models.minilm import checkpoint_dir, write_vocab
from kronk_testing.models.output import cached, gguf_writer

TINY_RERANKER = "tiny-reranker.gguf"

N_EMBD = 32
N_LAYER = 2
N_HEAD = 4
N_FF = 64
N_CTX = 512
SEED = 0


def make_tiny_reranker(path: Path) -> Path:
    name = "Kronk tiny reranker (random weights, MiniLM vocabulary)"
    with gguf_writer(path, gguf.MODEL_ARCH.BERT, name) as writer:
        _fill(writer, path)
    return path


def _fill(writer: gguf.GGUFWriter, path: Path) -> None:
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_block_count(N_LAYER)
    writer.add_head_count(N_HEAD)
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.RANK)
    n_vocab = write_vocab(writer, checkpoint_dir(path.parent))

    rng = np.random.default_rng(SEED)

    def matrix(rows: int, cols: int) -> np.ndarray[Any, np.dtype[np.float32]]:
        # numpy shape is (out, in); GGUFWriter reverses it into ggml's (in, out) order.
        return (rng.standard_normal((rows, cols)) * 0.2).astype(np.float32)

    def ones(size: int) -> np.ndarray[Any, np.dtype[np.float32]]:
        return np.ones(size, dtype=np.float32)

    def zeros(size: int) -> np.ndarray[Any, np.dtype[np.float32]]:
        return np.zeros(size, dtype=np.float32)

    writer.add_tensor("token_embd.weight", matrix(n_vocab, N_EMBD))
    writer.add_tensor("token_types.weight", matrix(2, N_EMBD))
    writer.add_tensor("position_embd.weight", matrix(N_CTX, N_EMBD))
    writer.add_tensor("token_embd_norm.weight", ones(N_EMBD))
    writer.add_tensor("token_embd_norm.bias", zeros(N_EMBD))
    for i in range(N_LAYER):
        blk = f"blk.{i}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{blk}.{name}.weight", matrix(N_EMBD, N_EMBD))
            writer.add_tensor(f"{blk}.{name}.bias", zeros(N_EMBD))
        writer.add_tensor(f"{blk}.attn_output_norm.weight", ones(N_EMBD))
        writer.add_tensor(f"{blk}.attn_output_norm.bias", zeros(N_EMBD))
        writer.add_tensor(f"{blk}.ffn_up.weight", matrix(N_FF, N_EMBD))
        writer.add_tensor(f"{blk}.ffn_up.bias", zeros(N_FF))
        writer.add_tensor(f"{blk}.ffn_down.weight", matrix(N_EMBD, N_FF))
        writer.add_tensor(f"{blk}.ffn_down.bias", zeros(N_EMBD))
        writer.add_tensor(f"{blk}.layer_output_norm.weight", ones(N_EMBD))
        writer.add_tensor(f"{blk}.layer_output_norm.bias", zeros(N_EMBD))
    # The classification head on the [CLS] state: dense + tanh, then one output logit.
    writer.add_tensor("cls.weight", matrix(N_EMBD, N_EMBD))
    writer.add_tensor("cls.bias", zeros(N_EMBD))
    writer.add_tensor("cls.output.weight", matrix(1, N_EMBD))
    writer.add_tensor("cls.output.bias", zeros(1))


def tiny_reranker_gguf(out_dir: Path) -> Path:
    """The reranker under out_dir, generated on first use."""
    return cached(out_dir / TINY_RERANKER, make_tiny_reranker)
