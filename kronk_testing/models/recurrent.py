"""Generate tiny models whose state cannot be cut back, for tests (the output is cached).

- `lfm2` (LiquidAI's LFM2): a hybrid of short-convolution layers, which keep a recurrent
  state, and attention layers, which keep KV cells;
- the same LFM2 with a sliding window on its attention layers (as llama.cpp reads
  `lfm2.attention.sliding_window`): both kinds of state that cannot be cut;
- `mamba2`: a pure state-space model, nothing but recurrent state.

llama.cpp keeps one state per sequence for their recurrent layers, updated in place by
every token, so a sequence cannot be cut back to an earlier position: the caches save
and restore it instead (IMC's checkpoints). Random weights, the real Gemma 3 tokenizer
(as kronk_testing.models.tiny); the output head's scale gives peaked next-token distributions,
so greedy answers do not hinge on near ties.

Command line: python scripts/make_tiny_recurrent.py [--out DIR]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

from kronk_testing.models import TINY_LFM2, TINY_LFM2_SWA, TINY_MAMBA2
from kronk_testing.models.output import gguf_writer
from kronk_testing.models.tiny import copy_tokenizer, gemma_gguf_path

CONTEXT_LENGTH = 4096
N_EMBD = 64
SEED = 2

# LFM2: which layers attend (the others are short convolutions), and their shapes.
LFM2_ATTENTION = (False, True, False)
LFM2_HEAD = 4
LFM2_HEAD_KV = 2
LFM2_FF = 128
LFM2_CONV_CACHE = 3  # the convolution's width: it keeps the last 2 tokens' inputs
LFM2_WINDOW = 128

# Mamba-2: inner size 2 * N_EMBD in heads of 32, one group.
MAMBA2_LAYER = 2
MAMBA2_INNER = 2 * N_EMBD
MAMBA2_HEAD_DIM = 32
MAMBA2_STATE = 16
MAMBA2_CONV = 4

F32 = np.float32
F16 = np.float16


class _Weights:
    """Adds random tensors; numpy shapes are (out, in), GGUFWriter reverses them."""

    def __init__(self, writer: gguf.GGUFWriter) -> None:
        self.writer = writer
        self.rng = np.random.default_rng(SEED)

    def random(self, name: str, *shape: int, scale: float | None = None, dtype: Any = F32) -> None:
        # 1/sqrt(fan-in) keeps activations at unit scale through the layers.
        scale = scale if scale is not None else shape[-1] ** -0.5
        data = self.rng.standard_normal(shape, dtype=F32) * scale
        self.writer.add_tensor(name, data.astype(dtype))

    def constant(self, name: str, value: float, *shape: int) -> None:
        self.writer.add_tensor(name, np.full(shape, value, dtype=F32))


def _common(writer: gguf.GGUFWriter, n_layer: int) -> tuple[_Weights, int]:
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    n_vocab = copy_tokenizer(gemma_gguf_path(), writer)
    writer.add_vocab_size(n_vocab)
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(n_layer)
    writer.add_layer_norm_rms_eps(1e-5)
    weights = _Weights(writer)
    weights.random("token_embd.weight", n_vocab, N_EMBD, scale=1.0, dtype=F16)
    # An output head of its own: tied to the embedding, the residual stream would make
    # every token predict itself. Unit scale spreads the logits by about sqrt(N_EMBD), so
    # the top token stands clear of the next.
    weights.random("output.weight", n_vocab, N_EMBD, scale=1.0, dtype=F16)
    return weights, n_vocab


def make_tiny_lfm2(path: Path, *, sliding_window: int = 0) -> Path:
    """Writes a 3-layer LFM2 (convolution, attention, convolution) to `path`; its
    attention attends over the last `sliding_window` positions where that is not 0."""
    window = f", {sliding_window}-token window" if sliding_window else ""
    name = f"Kronk tiny LFM2{window} (random weights, Gemma 3 tokenizer)"
    with gguf_writer(Path(path), gguf.MODEL_ARCH.LFM2, name) as writer:
        weights, _ = _common(writer, len(LFM2_ATTENTION))
        if sliding_window:
            writer.add_sliding_window(sliding_window)
        head_dim = N_EMBD // LFM2_HEAD
        writer.add_feed_forward_length(LFM2_FF)
        writer.add_head_count(LFM2_HEAD)
        writer.add_head_count_kv([LFM2_HEAD_KV if attends else 0 for attends in LFM2_ATTENTION])
        writer.add_rope_freq_base(10000.0)
        writer.add_shortconv_l_cache(LFM2_CONV_CACHE)
        weights.constant("token_embd_norm.weight", 1.0, N_EMBD)  # LFM2's output norm
        for i, attends in enumerate(LFM2_ATTENTION):
            blk = f"blk.{i}"
            weights.constant(f"{blk}.attn_norm.weight", 1.0, N_EMBD)
            if attends:
                kv = LFM2_HEAD_KV * head_dim
                weights.constant(f"{blk}.attn_q_norm.weight", 1.0, head_dim)
                weights.constant(f"{blk}.attn_k_norm.weight", 1.0, head_dim)
                weights.random(f"{blk}.attn_q.weight", N_EMBD, N_EMBD, dtype=F16)
                weights.random(f"{blk}.attn_k.weight", kv, N_EMBD, dtype=F16)
                weights.random(f"{blk}.attn_v.weight", kv, N_EMBD, dtype=F16)
                weights.random(f"{blk}.attn_output.weight", N_EMBD, N_EMBD, dtype=F16)
            else:
                weights.random(f"{blk}.shortconv.conv.weight", N_EMBD, LFM2_CONV_CACHE)
                weights.random(f"{blk}.shortconv.in_proj.weight", 3 * N_EMBD, N_EMBD, dtype=F16)
                weights.random(f"{blk}.shortconv.out_proj.weight", N_EMBD, N_EMBD, dtype=F16)
            weights.constant(f"{blk}.ffn_norm.weight", 1.0, N_EMBD)
            weights.random(f"{blk}.ffn_gate.weight", LFM2_FF, N_EMBD, dtype=F16)
            weights.random(f"{blk}.ffn_up.weight", LFM2_FF, N_EMBD, dtype=F16)
            weights.random(f"{blk}.ffn_down.weight", N_EMBD, LFM2_FF, dtype=F16)
    return Path(path)


def make_tiny_mamba2(path: Path) -> Path:
    """Writes a 2-layer Mamba-2 to `path`."""
    name = "Kronk tiny Mamba-2 (random weights, Gemma 3 tokenizer)"
    n_head = MAMBA2_INNER // MAMBA2_HEAD_DIM
    conv_dim = MAMBA2_INNER + 2 * MAMBA2_STATE  # x, B and C go through the convolution
    with gguf_writer(Path(path), gguf.MODEL_ARCH.MAMBA2, name) as writer:
        weights, _ = _common(writer, MAMBA2_LAYER)
        writer.add_feed_forward_length(0)  # unused, but read when loading
        writer.add_head_count(0)
        writer.add_ssm_conv_kernel(MAMBA2_CONV)
        writer.add_ssm_inner_size(MAMBA2_INNER)
        writer.add_ssm_state_size(MAMBA2_STATE)
        writer.add_ssm_time_step_rank(n_head)
        writer.add_ssm_group_count(1)
        weights.constant("output_norm.weight", 1.0, N_EMBD)
        for i in range(MAMBA2_LAYER):
            blk = f"blk.{i}"
            weights.constant(f"{blk}.attn_norm.weight", 1.0, N_EMBD)
            # z (the gate), then x, B, C (convolved), then dt per head.
            in_proj = MAMBA2_INNER + conv_dim + n_head
            weights.random(f"{blk}.ssm_in.weight", in_proj, N_EMBD, dtype=F16)
            weights.random(f"{blk}.ssm_conv1d.weight", conv_dim, MAMBA2_CONV)
            weights.constant(f"{blk}.ssm_conv1d.bias", 0.0, conv_dim)
            weights.constant(f"{blk}.ssm_dt.bias", 0.0, n_head)
            # A = -exp(A_log) per head, (n_head, 1) as the converter unsqueezes it: decays
            # from fast to slow, so the state carries both recent and older tokens.
            decay = -np.exp(np.linspace(0.0, 2.0, n_head, dtype=F32)).reshape(n_head, 1)
            writer.add_tensor(f"{blk}.ssm_a", decay)
            writer.add_tensor(f"{blk}.ssm_d", np.ones((n_head, 1), dtype=F32))
            weights.constant(f"{blk}.ssm_norm.weight", 1.0, 1, MAMBA2_INNER)
            weights.random(f"{blk}.ssm_out.weight", N_EMBD, MAMBA2_INNER, dtype=F16)
    return Path(path)


def make_tiny_lfm2_swa(path: Path) -> Path:
    return make_tiny_lfm2(path, sliding_window=LFM2_WINDOW)


MAKERS = {
    TINY_LFM2: make_tiny_lfm2,
    TINY_LFM2_SWA: make_tiny_lfm2_swa,
    TINY_MAMBA2: make_tiny_mamba2,
}
