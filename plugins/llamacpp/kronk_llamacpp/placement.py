"""The llamacpp section's `device`, `rpc_servers` and `tensor_split` → llama.cpp model
parameters."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp

from kronk_core.contract import ModelConfig, ModelLoadError
from kronk_llamacpp import rpc
from kronk_llamacpp.devices import device_handle, list_devices, local_gpus
from kronk_llamacpp.settings import SETTINGS


def _use_devices(params: llama_cpp.llama_model_params, handles: Sequence[int]) -> None:
    """llama.cpp's NULL-terminated device list; the array lives as long as `params`."""
    chosen = (ctypes.c_void_p * (len(handles) + 1))(*handles, None)
    params._kronk_devices = chosen
    params.devices = ctypes.cast(chosen, ctypes.c_void_p).value


def _local_gpus() -> list[int]:
    return [device_handle(device.name) for device in local_gpus(list_devices())]


def apply_placement(params: llama_cpp.llama_model_params, config: ModelConfig) -> None:
    """Pin to one device, spread over RPC workers, or split across GPUs."""
    llama, key = SETTINGS.of(config), config.section_key(SETTINGS.name)
    if llama.rpc_servers:
        workers = rpc.add_servers(llama.rpc_servers)
        _use_devices(params, [*workers, *_local_gpus()])
    elif llama.device is None and rpc.connected():
        # Without a list llama.cpp would put every worker this process added first.
        _use_devices(params, _local_gpus())
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
        _use_devices(params, [device_handle(llama.device)])
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
