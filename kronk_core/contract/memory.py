"""Devices a backend can run models on, and a model's memory estimate (the manual's chapter 3.7).

Plain dataclasses: backends fill them (`Backend.devices`, `Backend.memory_estimate`),
the CLI and the admin endpoints show them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


def available_ram() -> int | None:
    """MemAvailable (free plus reclaimable cache) on Linux; None elsewhere."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@dataclass(frozen=True, slots=True)
class Device:
    """One device as the backend sees it. `type`: cpu, gpu, igpu (shares host memory), accel."""

    index: int
    name: str  # what a model config's `device` names, e.g. "CUDA0"
    description: str
    type: str
    memory_free: int
    memory_total: int


@dataclass(frozen=True, slots=True)
class DeviceShare:
    """What a load would put on one device, next to what that device has free now."""

    device: str
    device_type: str
    weights_bytes: int
    kv_bytes: int
    memory_free: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.memory_free


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Total = model weights + KV cache; KV = context_window x n_seq_max x bytes per token."""

    weights_bytes: int
    context_window: int  # per slot
    n_seq_max: int
    cache_type_k: str
    cache_type_v: str
    n_layer: int
    kv_bytes_per_token: int  # all layers, K and V
    placement: tuple[DeviceShare, ...] = ()
    # A vision or audio projector's weights, and what it reads ("image", "audio").
    projector_bytes: int = 0
    media: tuple[str, ...] = ()

    @property
    def kv_bytes_per_slot(self) -> int:
        return self.context_window * self.kv_bytes_per_token

    @property
    def kv_bytes(self) -> int:
        return self.n_seq_max * self.kv_bytes_per_slot

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.projector_bytes + self.kv_bytes

    @property
    def fits(self) -> bool:
        return all(share.fits for share in self.placement)


def estimate_summary(estimate: MemoryEstimate) -> dict[str, object]:
    """The estimate with its derived totals, as the admin endpoint and the CLI show it."""
    return {
        "weights_bytes": estimate.weights_bytes,
        "projector_bytes": estimate.projector_bytes,
        "media": list(estimate.media),
        "kv_bytes": estimate.kv_bytes,
        "total_bytes": estimate.total_bytes,
        "kv_bytes_per_token": estimate.kv_bytes_per_token,
        "kv_bytes_per_slot": estimate.kv_bytes_per_slot,
        "context_window": estimate.context_window,
        "n_seq_max": estimate.n_seq_max,
        "n_layer": estimate.n_layer,
        "cache_type_k": estimate.cache_type_k,
        "cache_type_v": estimate.cache_type_v,
        "fits": estimate.fits,
        "placement": [
            {
                "device": share.device,
                "type": share.device_type,
                "weights_bytes": share.weights_bytes,
                "kv_bytes": share.kv_bytes,
                "total_bytes": share.total_bytes,
                "memory_free": share.memory_free,
                "fits": share.fits,
            }
            for share in estimate.placement
        ],
    }
