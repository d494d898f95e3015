"""The manual's memory estimate (chapter 3.7), where it would go, and the refusal before a load.

Total = weights (the GGUF file's size) + KV cache, where the KV cache is context_window x
n_seq_max x bytes per token, and a token costs, summed over layers,
head_count_kv x (key_length x bytes of cache_type_k + value_length x bytes of cache_type_v).
Compute buffers come on top, so the estimate is a floor: a load it says cannot fit surely
cannot.

A model whose entry sets no context_window gets its training length (at most the
server's `context_window`), lowered to what the estimate says fits in 90% of the free
memory of each device it would use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kronk_core.contract import (
    Device,
    DeviceShare,
    InsufficientMemoryError,
    MemoryEstimate,
    ModelConfig,
    ModelLoadError,
)
from kronk_llamacpp.devices import local_gpus, worker_devices
from kronk_llamacpp.embedding import DEFAULT_CONTEXT_WINDOW as EMBEDDING_CONTEXT_WINDOW
from kronk_llamacpp.gguf_meta import read_metadata
from kronk_llamacpp.params import GGML_TYPE_BYTES
from kronk_llamacpp.settings import SETTINGS, LlamaCppSettings, SplitMode

# Of a device's free memory, what a chosen context may fill: the rest is for compute buffers.
FIT_SHARE = 0.9
# llama.cpp pads a context to this many cells; a chosen context is a multiple of it.
CONTEXT_STEP = 256
# A context is not lowered below this (or the training length, if shorter): a model that
# cannot have it is refused with what to lower instead.
MIN_CONTEXT_WINDOW = 2048


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
        return [] if pinned.type not in ("gpu", "igpu") else [pinned]
    gpus = local_gpus(devices)
    if llama.rpc_servers:  # the workers' devices first, as placement passes them
        gpus = [*worker_devices(devices, llama.rpc_servers), *gpus]
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


@dataclass(frozen=True)
class ContextChoice:
    """The context window a model whose entry sets none gets, and why."""

    tokens: int
    trained: int  # the model's training length
    ceiling: int  # what it gets with room enough: trained, or the server's context_window
    device: str | None = None  # the device whose free memory lowered it

    def describe(self) -> str:
        """For the load's log line."""
        wanted = "its training length" if self.ceiling == self.trained else "the server's"
        if self.device is None:
            return f"{self.tokens} tokens per slot ({wanted})"
        return (
            f"{self.tokens} tokens per slot, lowered from {self.ceiling} ({wanted}) "
            f"to fit the free memory of {self.device}"
        )


def training_length(meta: dict[str, Any]) -> int:
    arch = str(meta.get("general.architecture", ""))
    return int(meta.get(f"{arch}.context_length", 0)) or EMBEDDING_CONTEXT_WINDOW


def choose_context(
    config: ModelConfig, devices: Sequence[Device], meta: dict[str, Any], weights: int
) -> ContextChoice:
    """The context window for a config without one: the training length (embedding models:
    at most 8192; text models: at most the server's context_window), lowered until the
    weights and the KV cache fill at most FIT_SHARE of each device's free memory."""
    trained = training_length(meta)
    arch = str(meta.get("general.architecture", ""))
    if f"{arch}.pooling_type" in meta:  # an embedding model: one input per context
        ceiling = min(trained, EMBEDDING_CONTEXT_WINDOW)
    else:
        ceiling = min(trained, config.context_default or trained)
    n_layer, per_token = kv_bytes_per_token(SETTINGS.of(config), meta)
    # The KV cache grows with the context: each device's share of one slot-token, in a
    # large unit so that the shares' rounding does not matter.
    unit = 1 << 20
    kv_shares = place(config, devices, 0, unit * config.n_seq_max * per_token, n_layer)
    weights_on = {
        share.device: share.weights_bytes for share in place(config, devices, weights, 0, n_layer)
    }
    tokens, tightest = ceiling, None
    for share in kv_shares:
        room = FIT_SHARE * share.memory_free - weights_on.get(share.device, 0)
        fits = int(room * unit // share.kv_bytes) if share.kv_bytes else ceiling
        if fits < tokens:
            tokens, tightest = fits, share.device
    if tightest is None:
        return ContextChoice(ceiling, trained, ceiling)
    floor = min(ceiling, MIN_CONTEXT_WINDOW)
    tokens = max(floor, tokens // CONTEXT_STEP * CONTEXT_STEP)
    return ContextChoice(tokens, trained, ceiling, tightest)


def estimate(config: ModelConfig, devices: Sequence[Device]) -> MemoryEstimate:
    """The estimate for a config whose model_path is resolved, placed on `devices`. Without
    a context_window, the one `choose_context` gives."""
    assert config.model_path is not None
    llama = SETTINGS.of(config)
    meta = read_metadata(config.model_path)
    n_layer, per_token = kv_bytes_per_token(llama, meta)
    # LoRA adapters' tensors sit beside the weights they adapt, on the same devices.
    adapters = sum(adapter.path.stat().st_size for adapter in config.lora)
    weights = config.model_path.stat().st_size + adapters
    context = config.context_window or choose_context(config, devices, meta, weights).tokens
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
