"""The llamacpp section's `device` and `tensor_split` → llama.cpp model parameters."""

from __future__ import annotations

import ctypes

import llama_cpp

from kronk_core.config import ModelConfig
from kronk_core.errors import ModelLoadError
from kronk_llamacpp.devices import device_handle, list_devices
from kronk_llamacpp.settings import SETTINGS


def apply_placement(params: llama_cpp.llama_model_params, config: ModelConfig) -> None:
    """Pin to one device or split across GPUs; the arrays live as long as `params`."""
    llama, key = SETTINGS.of(config), config.section_key(SETTINGS.name)
    if llama.device is not None:
        devices = {device.name: device for device in list_devices()}
        if llama.device not in devices:
            raise ModelLoadError(
                f"{key}.device: unknown device {llama.device!r} "
                f"(this build of llama.cpp has: {', '.join(devices) or 'none'})"
            )
        if devices[llama.device].type == "cpu":
            params.n_gpu_layers = 0  # llama.cpp: no layer offloaded
            return
        chosen = (ctypes.c_void_p * 2)(device_handle(llama.device), None)
        params._kronk_devices = chosen
        params.devices = ctypes.cast(chosen, ctypes.c_void_p).value
        params.split_mode = llama_cpp.LLAMA_SPLIT_MODE_NONE
        params.main_gpu = 0
    if llama.tensor_split is not None:
        if len(llama.tensor_split) > llama_cpp.LLAMA_MAX_DEVICES:
            raise ModelLoadError(
                f"{key}.tensor_split: at most {llama_cpp.LLAMA_MAX_DEVICES} shares"
            )
        shares = (ctypes.c_float * llama_cpp.LLAMA_MAX_DEVICES)(*llama.tensor_split)
        params._kronk_tensor_split = shares
        params.tensor_split = shares

