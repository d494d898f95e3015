"""Which processor this machine has, for `kronk libs` to build for without being told.

Each vendor's own tool says what it sees: `nvidia-smi` (CUDA, with each GPU's compute
capability), `rocminfo` (ROCm/HIP, with each GPU's gfx target), `vulkaninfo` (any Vulkan
GPU); an Apple Silicon Mac has Metal. The first found wins, in that order; else the CPU.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Detected:
    """A processor to build for: its name, what was found, and CMake arguments for it."""

    processor: str
    found: str
    cmake_args: tuple[str, ...] = ()


def _run(*command: str) -> str | None:
    """A tool's output, or None when it is missing, fails or hangs."""
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _cuda() -> Detected | None:
    listing = _run("nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader")
    if not listing:
        return None
    gpus: list[tuple[str, str]] = []
    for line in listing.splitlines():
        name, _, capability = line.rpartition(",")
        if re.fullmatch(r"\s*\d+\.\d+\s*", capability):
            gpus.append((name.strip(), capability.strip()))
    if not gpus:
        return None
    # Only the architectures present: a build for every one takes several times longer.
    architectures = sorted({capability.replace(".", "") for _, capability in gpus}, key=int)
    found = ", ".join(f"{name} (compute capability {cap})" for name, cap in gpus)
    return Detected(
        "cuda", found, (f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(architectures)}",)
    )


def _hip() -> Detected | None:
    listing = _run("rocminfo")
    if not listing:
        return None
    targets = sorted(set(re.findall(r"^\s*Name:\s*(gfx[0-9a-f]+)\s*$", listing, re.MULTILINE)))
    if not targets:
        return None
    return Detected(
        "hip", f"AMD GPU ({', '.join(targets)})", (f"-DAMDGPU_TARGETS={';'.join(targets)}",)
    )


def _vulkan() -> Detected | None:
    listing = _run("vulkaninfo", "--summary")
    if not listing:
        return None
    names = re.findall(r"deviceName\s*=\s*(.+)", listing)
    kinds = re.findall(r"deviceType\s*=\s*PHYSICAL_DEVICE_TYPE_(\w+)", listing)
    gpus = [name.strip() for name, kind in zip(names, kinds, strict=False) if "GPU" in kind]
    return Detected("vulkan", f"Vulkan GPU ({', '.join(gpus)})") if gpus else None


def detect() -> Detected:
    """The processor to build for on this machine."""
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return Detected("metal", "Apple Silicon")
    for probe in (_cuda, _hip, _vulkan):
        found = probe()
        if found is not None:
            return found
    return Detected("cpu", "no GPU (nvidia-smi, rocminfo and vulkaninfo found none)")
