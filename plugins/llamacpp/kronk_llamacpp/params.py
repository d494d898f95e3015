"""Kronk model config → llama.cpp model and context parameters."""

from __future__ import annotations

import os
from dataclasses import dataclass

import llama_cpp

from kronk_core.contract import ModelConfig
from kronk_llamacpp.placement import apply_placement
from kronk_llamacpp.settings import (
    SETTINGS,
    CacheType,
    FlashAttention,
    LlamaCppSettings,
    RopeScaling,
    SplitMode,
)

# enum ggml_type values (stable in ggml.h; the Python bindings export only some).
GGML_TYPES = {
    CacheType.f32: 0,
    CacheType.f16: 1,
    CacheType.q4_0: 2,
    CacheType.q4_1: 3,
    CacheType.q5_0: 6,
    CacheType.q5_1: 7,
    CacheType.q8_0: 8,
    CacheType.iq4_nl: 20,
    CacheType.bf16: 30,
}

GGML_TYPE_BYTES = {
    CacheType.f32: 4.0,
    CacheType.f16: 2.0,
    CacheType.bf16: 2.0,
    CacheType.q8_0: 34 / 32,
    CacheType.q4_0: 18 / 32,
    CacheType.q4_1: 20 / 32,
    CacheType.iq4_nl: 18 / 32,
    CacheType.q5_0: 22 / 32,
    CacheType.q5_1: 24 / 32,
}

FLASH_ATTENTION = {
    FlashAttention.auto: llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    FlashAttention.enabled: llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    FlashAttention.disabled: llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}

SPLIT_MODES = {
    SplitMode.none: llama_cpp.LLAMA_SPLIT_MODE_NONE,
    SplitMode.layer: llama_cpp.LLAMA_SPLIT_MODE_LAYER,
    SplitMode.row: llama_cpp.LLAMA_SPLIT_MODE_ROW,
}

ROPE_SCALING = {
    RopeScaling.none: llama_cpp.LLAMA_ROPE_SCALING_TYPE_NONE,
    RopeScaling.linear: llama_cpp.LLAMA_ROPE_SCALING_TYPE_LINEAR,
    RopeScaling.yarn: llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN,
}


# n_ubatch of a model with a projector, unless set (Kronk's default for vision models).
MEDIA_N_UBATCH = 2048


def model_params(config: ModelConfig) -> llama_cpp.llama_model_params:
    llama = SETTINGS.of(config)
    params = llama_cpp.llama_model_default_params()
    # Kronk: 0 = all layers, -1 = none, N = N. llama.cpp: -1 = all, 0 = none.
    if llama.n_gpu_layers == 0:
        params.n_gpu_layers = -1
    elif llama.n_gpu_layers == -1:
        params.n_gpu_layers = 0
    else:
        params.n_gpu_layers = llama.n_gpu_layers
    params.split_mode = SPLIT_MODES[llama.split_mode]
    params.main_gpu = llama.main_gpu
    apply_placement(params, config)  # device, tensor_split
    return params


@dataclass(frozen=True)
class RopeScale:
    """How far positions are stretched: llama.cpp's frequency scale and YaRN's original context
    (None: the model's own)."""

    freq_scale: float | None
    orig_ctx: int | None


def rope_scale(llama: LlamaCppSettings, n_ctx_per_seq: int, n_ctx_train: int) -> RopeScale:
    """The scale the manual derives from the extension ratio when scaling is on and not set:
    a window 4x the training length gets a frequency scale of 1/4, YaRN's original context is
    the training length. llama.cpp alone would keep the model's scale (1.0: no extension) and
    only change how positions are rotated. A window within the training length is not scaled."""
    if llama.rope_scaling is RopeScaling.none:
        return RopeScale(llama.rope_freq_scale, llama.yarn_orig_ctx)
    original = llama.yarn_orig_ctx or n_ctx_train
    freq_scale = llama.rope_freq_scale
    if freq_scale is None and original and n_ctx_per_seq > original:
        freq_scale = original / n_ctx_per_seq
    orig_ctx = llama.yarn_orig_ctx
    if orig_ctx is None and llama.rope_scaling is RopeScaling.yarn and n_ctx_train:
        orig_ctx = n_ctx_train
    return RopeScale(freq_scale, orig_ctx)


def unified_kv(llama: LlamaCppSettings, model: llama_cpp.llama_model_p) -> bool:
    """Whether the slots share one KV pool (`kv_unified`, `auto` decided by the model).

    In a pool every slot's attention looks over all slots' cells: agents holding
    thousands of tokens per slot made SmolLM2's fleets 1.3-1.6x slower than per-slot
    streams (bench_fleet_layout.py). Sliding-window layers look over their window only,
    and there a pool batches short decodes better (Gemma 3: bench_step_split.py);
    recurrent state has no cells to share and its copies stay partial in a pool.
    """
    if llama.kv_unified != "auto":
        return llama.kv_unified
    return bool(
        llama_cpp.llama_model_n_swa(model)
        or llama_cpp.llama_model_is_recurrent(model)
        or llama_cpp.llama_model_is_hybrid(model)
    )


def context_params(
    config: ModelConfig, model: llama_cpp.llama_model_p, n_ctx_per_seq: int, n_ctx_train: int = 0
) -> llama_cpp.llama_context_params:
    llama = SETTINGS.of(config)
    params = llama_cpp.llama_context_default_params()
    # context_window x n_seq_max cells, in one pool or a stream per slot; the engine keeps
    # each slot within context_window, so neither overflows.
    params.n_ctx = n_ctx_per_seq * config.n_seq_max
    params.n_batch = config.n_batch
    params.n_ubatch = llama.n_ubatch
    if config.projector_path is not None and "n_ubatch" not in llama.model_fields_set:
        # Attention over an image is not causal in some models (Gemma 3): its tokens
        # must fit one micro-batch.
        params.n_ubatch = min(config.n_batch, MEDIA_N_UBATCH)
    params.n_seq_max = config.n_seq_max
    params.kv_unified = unified_kv(llama, model)
    threads = llama.n_threads or os.cpu_count() or 1
    params.n_threads = threads
    params.n_threads_batch = threads
    params.type_k = GGML_TYPES[llama.cache_type_k]
    params.type_v = GGML_TYPES[llama.cache_type_v]
    params.flash_attn_type = FLASH_ATTENTION[llama.flash_attention]
    params.offload_kqv = llama.offload_kqv
    params.op_offload = llama.op_offload
    params.swa_full = llama.swa_full
    params.no_perf = True
    if llama.rope_scaling is not RopeScaling.none:
        params.rope_scaling_type = ROPE_SCALING[llama.rope_scaling]
    if llama.rope_freq_base is not None:
        params.rope_freq_base = llama.rope_freq_base
    scale = rope_scale(llama, n_ctx_per_seq, n_ctx_train)
    if scale.freq_scale is not None:
        params.rope_freq_scale = scale.freq_scale
    if llama.yarn_ext_factor is not None:
        params.yarn_ext_factor = llama.yarn_ext_factor
    if llama.yarn_attn_factor is not None:
        params.yarn_attn_factor = llama.yarn_attn_factor
    if llama.yarn_beta_fast is not None:
        params.yarn_beta_fast = llama.yarn_beta_fast
    if llama.yarn_beta_slow is not None:
        params.yarn_beta_slow = llama.yarn_beta_slow
    if scale.orig_ctx is not None:
        params.yarn_orig_ctx = scale.orig_ctx
    return params
