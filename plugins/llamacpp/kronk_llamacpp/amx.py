"""Keep llama.cpp's CPU backend off Intel AMX unless asked for.

ggml puts the weights of a CPU that reports AMX into its AMX buffer type, and
its AMX matrix kernels crash on hosts that advertise the feature: SIGILL or
SIGSEGV in `ggml_backend_amx_mul_mat` at the first decode (seen on this
project's 2-core cloud VM, for llama-cpp-python and for llama.cpp's own
tools; upstream llama.cpp issue #20824). Dropping the AMX entry from the CPU
device's list of extra buffer types leaves the CPU_REPACK layout, which every
x86 CPU with AVX2 runs. `KRONK_LLAMACPP_AMX=1` keeps AMX.
"""

from __future__ import annotations

import ctypes
import logging
import os

import llama_cpp

log = logging.getLogger(__name__)

_CPU_DEVICE = 0  # GGML_BACKEND_DEVICE_TYPE_CPU
_ExtraBufts = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


def _ggml(name: str, restype: object, *argtypes: object) -> ctypes._CFuncPtr:
    # libllama's handle also resolves symbols of the ggml libraries it links.
    function = getattr(llama_cpp.llama_cpp._lib, name)
    function.restype = restype
    function.argtypes = list(argtypes)
    return function


def drop_amx_buffer_type() -> bool:
    """Remove AMX from the CPU's extra buffer types before any model loads; True if removed."""
    if os.environ.get("KRONK_LLAMACPP_AMX") == "1":
        return False
    dev_by_type = _ggml("ggml_backend_dev_by_type", ctypes.c_void_p, ctypes.c_int)
    backend_reg = _ggml("ggml_backend_dev_backend_reg", ctypes.c_void_p, ctypes.c_void_p)
    proc_address = _ggml(
        "ggml_backend_reg_get_proc_address", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p
    )
    buft_name = _ggml("ggml_backend_buft_name", ctypes.c_char_p, ctypes.c_void_p)
    device = dev_by_type(_CPU_DEVICE)
    if not device:
        return False
    address = proc_address(backend_reg(device), b"ggml_backend_dev_get_extra_bufts")
    if not address:
        return False
    # A NULL-terminated array that the CPU backend keeps for the whole process:
    # llama.cpp reads it again at every model load.
    types = _ExtraBufts(address)(device)
    count = 0
    while types[count]:
        count += 1
    names = [buft_name(types[index]) for index in range(count)]
    if b"AMX" not in names:
        return False
    kept = [types[index] for index, name in enumerate(names) if name != b"AMX"]
    for index in range(count):
        types[index] = kept[index] if index < len(kept) else None
    log.info("llama.cpp: AMX weights disabled (set KRONK_LLAMACPP_AMX=1 to keep them)")
    return True
