"""Which thread runs llama.cpp's CPU computations: one for the whole process, with OpenMP.

llama.cpp built with OpenMP (gcc's default, and llama-cpp-python's pip build) keeps
a pool of worker threads for every thread that computes. Kronk decodes each model
on an engine thread of its own, so a server with two models on the CPU (a chat
model and an embedding model, say) held two pools once both had computed; their
workers then outnumber the cores, and libgomp stops spin-waiting between a
decode's parallel steps in every pool: decode ran a third slower
(bench/bench_two_models.py, docs/model-pool.md). Models on the CPU share its cores,
so they compute one at a time anyway; computing on one thread keeps one pool.
Models with layers on a GPU or an RPC worker compute on their own threads.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, Protocol, TypeVar

import llama_cpp

from kronk_core.contract import ModelConfig
from kronk_llamacpp.devices import list_devices, local_gpus
from kronk_llamacpp.settings import SETTINGS

P = ParamSpec("P")
R = TypeVar("R")


class Runner(Protocol):
    """Runs one llama.cpp computation and returns what it returned."""

    def __call__(self, call: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...


@functools.cache
def uses_openmp() -> bool:
    return b"OPENMP = 1" in llama_cpp.llama_print_system_info()


def computes_on_cpu(config: ModelConfig) -> bool:
    """Whether every layer of the model runs on this machine's CPU."""
    llama = SETTINGS.of(config)
    if llama.rpc_servers:
        return False
    if llama.n_gpu_layers == -1:  # Kronk's -1: no layer offloaded
        return True
    devices = list_devices()
    if llama.device is not None:
        return any(d.name == llama.device and d.type == "cpu" for d in devices)
    return not local_gpus(devices)


class _CpuThread:
    """Runs calls on the process's one CPU compute thread, waiting for each."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="kronk-llama-cpu")
        self._ident = self._executor.submit(threading.get_ident).result()

    def __call__(self, call: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        if threading.get_ident() == self._ident:
            return call(*args, **kwargs)
        return self._executor.submit(call, *args, **kwargs).result()


_cpu_thread: _CpuThread | None = None
_cpu_thread_lock = threading.Lock()


def _forgotten_in_child() -> None:
    """A forked child has none of the parent's threads: its models start a thread anew."""
    global _cpu_thread, _cpu_thread_lock
    _cpu_thread, _cpu_thread_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forgotten_in_child)


def run_here(call: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """Runs the call on the caller's thread."""
    return call(*args, **kwargs)


def runner(config: ModelConfig) -> Runner:
    """How a model runs its llama.cpp computations (decode, encode): on the one CPU
    thread where OpenMP and a model wholly on the CPU meet, else on the caller's thread."""
    global _cpu_thread
    if not (uses_openmp() and computes_on_cpu(config)):
        return run_here
    with _cpu_thread_lock:
        if _cpu_thread is None:
            _cpu_thread = _CpuThread()
        return _cpu_thread
