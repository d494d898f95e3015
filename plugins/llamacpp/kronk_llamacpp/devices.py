"""llama.cpp's backend devices (ggml_backend_dev_*), with their free and total memory.

A device of an RPC worker (`rpc_servers`) has the type "rpc" and its worker's HOST:PORT as
its description.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Sequence

from kronk_core.contract import Device, available_ram
from kronk_llamacpp.library import ensure_initialised

# enum ggml_backend_dev_type (ggml-backend.h)
_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}
_functions: ctypes.CDLL | None = None


def _ggml() -> ctypes.CDLL:
    """ggml's device API, looked up through libllama's handle (its dependencies included)."""
    global _functions
    if _functions is None:
        ensure_initialised()
        import llama_cpp.llama_cpp as bindings

        lib = bindings._lib
        lib.ggml_backend_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        lib.ggml_backend_dev_get.restype = ctypes.c_void_p
        for name in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
            getattr(lib, name).restype = ctypes.c_char_p
        lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_type.restype = ctypes.c_int
        lib.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
        lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_reg_name.restype = ctypes.c_char_p
        lib.ggml_backend_dev_memory.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.POINTER(ctypes.c_size_t),
        ]
        lib.ggml_backend_dev_memory.restype = None
        _functions = lib
    return _functions


def list_devices() -> list[Device]:
    """Every device llama.cpp can place tensors on, in its own order.

    The CPU device reports all of RAM as free (llama.cpp does not measure it); on Linux
    its free memory is MemAvailable instead, which is what a load can really use.
    """
    lib = _ggml()
    devices = []
    for index in range(lib.ggml_backend_dev_count()):
        handle = lib.ggml_backend_dev_get(index)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(handle, ctypes.byref(free), ctypes.byref(total))
        kind = _TYPES.get(lib.ggml_backend_dev_type(handle), "unknown")
        if lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(handle)) == b"RPC":
            kind = "rpc"
        free_bytes = int(free.value)
        if kind == "cpu" and sys.platform.startswith("linux"):
            free_bytes = min(available_ram() or free_bytes, int(total.value))
        devices.append(
            Device(
                index=index,
                name=(lib.ggml_backend_dev_name(handle) or b"").decode(),
                description=(lib.ggml_backend_dev_description(handle) or b"").decode(),
                type=kind,
                memory_free=free_bytes,
                memory_total=int(total.value),
            )
        )
    return devices


def device_handle(name: str) -> int:
    """The ggml_backend_dev_t of the device called `name` (exact, as list_devices shows it)."""
    lib = _ggml()
    for index in range(lib.ggml_backend_dev_count()):
        handle = lib.ggml_backend_dev_get(index)
        if (lib.ggml_backend_dev_name(handle) or b"").decode() == name:
            return int(handle)
    raise LookupError(name)


def local_gpus(devices: Sequence[Device]) -> list[Device]:
    """The devices llama.cpp offloads to by default, workers aside: the GPUs, else the
    integrated GPUs."""
    return [d for d in devices if d.type == "gpu"] or [d for d in devices if d.type == "igpu"]


def worker_devices(devices: Sequence[Device], servers: Sequence[str]) -> list[Device]:
    """The devices of these RPC workers, in the order the servers are named."""
    return [d for server in servers for d in devices if d.type == "rpc" and d.description == server]
