"""The manual's memory estimate (chapter 3.7), where it would go, and the refusal before a load.

Total = weights (the GGUF file's size) + KV cache, where the KV cache is context_window x
n_seq_max x bytes per token, and a token costs, summed over layers,
head_count_kv x (key_length x bytes of cache_type_k + value_length x bytes of cache_type_v).
Compute buffers come on top, so the estimate is a floor: a load it says cannot fit surely
cannot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kronk_core.config import ModelConfig
from kronk_core.errors import InsufficientMemoryError, ModelLoadError
from kronk_core.memory import Device, DeviceShare, MemoryEstimate
from kronk_llamacpp.gguf_meta import read_metadata
from kronk_llamacpp.model import DEFAULT_CONTEXT_WINDOW
from kronk_llamacpp.params import GGML_TYPE_BYTES
from kronk_llamacpp.settings import SETTINGS, LlamaCppSettings, SplitMode

_GPU_TYPES = ("gpu", "igpu")


def _per_layer(value: Any, n_layer: int, default: int) -> list[int]:
    if isinstance(value, list):
        return [int(v) for v in value[:n_layer]]
    return [int(value if value is not None else default)] * n_layer


def kv_bytes_per_token(llama: LlamaCppSettings, meta: dict[str, Any]) -> tuple[int, int]:
    """(n_layer, bytes one token's K and V take over all layers) from GGUF metadata."""
    arch = str(meta.get("general.architecture", ""))
    n_layer = int(meta.get(f"{arch}.block_count", 0))
    n_embd = int(meta.get(f"{arch}.embedding_length", 0))
    heads = _per_layer(meta.get(f"{arch}.attention.head_count"), n_layer, 0)
    heads_kv = _per_layer(meta.get(f"{arch}.attention.head_count_kv"), n_layer, 0)
    per_token = 0.0
    for layer in range(n_layer):
        n_head = heads[layer]
        n_head_kv = heads_kv[layer] if f"{arch}.attention.head_count_kv" in meta else n_head
        head_dim = n_embd // n_head if n_head else 0
        key_len = int(meta.get(f"{arch}.attention.key_length", head_dim))
        value_len = int(meta.get(f"{arch}.attention.value_length", head_dim))
        per_token += n_head_kv * (
            key_len * GGML_TYPE_BYTES[llama.cache_type_k]
            + value_len * GGML_TYPE_BYTES[llama.cache_type_v]
        )
    return n_layer, round(per_token)


def _context_window(config: ModelConfig, meta: dict[str, Any]) -> int:
    if config.context_window:
        return config.context_window
    arch = str(meta.get("general.architecture", ""))
    trained = int(meta.get(f"{arch}.context_length", DEFAULT_CONTEXT_WINDOW))
    return min(trained, DEFAULT_CONTEXT_WINDOW)


def _gpu_targets(config: ModelConfig, devices: Sequence[Device]) -> list[Device]:
    """The devices llama.cpp would offload to."""
    llama, key = SETTINGS.of(config), config.section_key(SETTINGS.name)
    if llama.device is not None:
        pinned = next((d for d in devices if d.name == llama.device), None)
        if pinned is None:
            names = ", ".join(d.name for d in devices) or "none"
            raise ModelLoadError(
                f"{key}.device: unknown device {llama.device!r} "
                f"(this build of llama.cpp has: {names}; `kronk devices` lists them)"
            )
        return [] if pinned.type not in _GPU_TYPES else [pinned]
    gpus = [d for d in devices if d.type in _GPU_TYPES]
    if llama.tensor_split is not None and len(llama.tensor_split) > len(gpus):
        raise ModelLoadError(
            f"{key}.tensor_split: {len(llama.tensor_split)} shares for "
            f"{len(gpus)} GPU(s) ({', '.join(d.name for d in gpus) or 'none'})"
        )
    if llama.n_gpu_layers == -1 or not gpus:
        return []
    if llama.split_mode is SplitMode.none:
        if llama.main_gpu >= len(gpus):
            raise ModelLoadError(
                f"{key}.main_gpu: {llama.main_gpu} but there are {len(gpus)} GPU(s)"
            )
        return [gpus[llama.main_gpu]]
    return gpus


def _split(total: int, weights: Sequence[float]) -> list[int]:
    whole = sum(weights)
    return [round(total * w / whole) if whole else 0 for w in weights]


def place(
    config: ModelConfig, devices: Sequence[Device], weights: int, kv: int, n_layer: int
) -> tuple[DeviceShare, ...]:
    """Where the weights and the KV cache would go, device by device."""
    llama = SETTINGS.of(config)
    targets = _gpu_targets(config, devices)
    shares: list[DeviceShare] = []
    weights_gpu = kv_gpu = 0
    if targets:
        layers = n_layer + 1  # llama.cpp counts the output layer as one more
        offloaded = layers if llama.n_gpu_layers == 0 else min(llama.n_gpu_layers, layers)
        weights_gpu = weights * offloaded // layers
        kv_gpu = kv * min(offloaded, n_layer) // max(n_layer, 1) if llama.offload_kqv else 0
        if llama.tensor_split is not None and len(targets) > 1:
            proportions = [*llama.tensor_split, *[0.0] * len(targets)][: len(targets)]
        else:  # llama.cpp's default: in proportion to each device's free memory
            proportions = [float(d.memory_free) for d in targets]
        for device, w, k in zip(
            targets, _split(weights_gpu, proportions), _split(kv_gpu, proportions), strict=True
        ):
            if w or k:
                shares.append(DeviceShare(device.name, device.type, w, k, device.memory_free))
    cpu = next((d for d in devices if d.type == "cpu"), None)
    if cpu is not None and (weights - weights_gpu or kv - kv_gpu):
        shares.append(
            DeviceShare(cpu.name, cpu.type, weights - weights_gpu, kv - kv_gpu, cpu.memory_free)
        )
    return tuple(shares)


def estimate(config: ModelConfig, devices: Sequence[Device]) -> MemoryEstimate:
    """The estimate for a config whose model_path is resolved, placed on `devices`."""
    assert config.model_path is not None
    llama = SETTINGS.of(config)
    meta = read_metadata(config.model_path)
    n_layer, per_token = kv_bytes_per_token(llama, meta)
    weights = config.model_path.stat().st_size
    context = _context_window(config, meta)
    kv = context * config.n_seq_max * per_token
    projector, media = _projector(config)
    return MemoryEstimate(
        weights_bytes=weights,
        context_window=context,
        n_seq_max=config.n_seq_max,
        cache_type_k=llama.cache_type_k.value,
        cache_type_v=llama.cache_type_v.value,
        n_layer=n_layer,
        kv_bytes_per_token=per_token,
        # The projector sits with the model's first layers (llama.cpp puts it on the
        # main device): its weights count as the model's there.
        placement=place(config, devices, weights + projector, kv, n_layer),
        projector_bytes=projector,
        media=media,
    )


def _projector(config: ModelConfig) -> tuple[int, tuple[str, ...]]:
    """The projector's size and what it reads, from its GGUF header."""
    path = config.projector_path
    if path is None:
        return 0, ()
    meta = read_metadata(path)
    kinds = [kind for kind, key in PROJECTOR_KEYS if meta.get(key)]
    return path.stat().st_size, tuple(kinds)


# What an mmproj file's header says it reads.
PROJECTOR_KEYS = (("image", "clip.has_vision_encoder"), ("audio", "clip.has_audio_encoder"))


def _gib(count: int) -> str:
    return f"{count / 2**30:.2f} GiB"


def refuse_if_too_large(config: ModelConfig, found: MemoryEstimate) -> None:
    """InsufficientMemoryError saying what to lower, when a share exceeds its device's memory."""
    for share in found.placement:
        if share.fits:
            continue
        advice = (
            "lower context_window or n_seq_max, or set llamacpp.cache_type_k and "
            "llamacpp.cache_type_v to q8_0"
        )
        if share.device_type != "cpu":
            advice += ", or put fewer layers on it (llamacpp.n_gpu_layers)"
        raise InsufficientMemoryError(
            f"models.{config.id}: needs about {_gib(share.total_bytes)} on {share.device} "
            f"(weights {_gib(share.weights_bytes)} + KV cache {_gib(share.kv_bytes)}; the KV "
            f"cache is context_window {found.context_window} x n_seq_max {found.n_seq_max} x "
            f"{found.kv_bytes_per_token} bytes per token with cache_type_k "
            f"{found.cache_type_k}, cache_type_v {found.cache_type_v}), but {share.device} has "
            f"{_gib(share.memory_free)} free: {advice}"
        )
