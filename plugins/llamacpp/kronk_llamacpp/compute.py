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

Handing each decode to that thread and back cost 0.15-0.2 ms a step (two wake-ups,
while an OpenMP worker spins on the other core): 3% of a one-stream step of the
default model on two cores. So the first model on the CPU runs its engine loop on the
compute thread itself (`CpuThread.engine_thread`), and its calls need no hand-over; the
calls of other threads (a second model's engine, an embedding model, media encoding)
wait in a queue, which that loop serves before each of its own calls and while it idles.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, ParamSpec, Protocol, TypeVar

import llama_cpp

from kronk_core.contract import ModelConfig
from kronk_llamacpp.devices import list_devices, local_gpus
from kronk_llamacpp.settings import SETTINGS

_NAME = "kronk-llama-cpu"

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


class _Call:
    """A call another thread queued for the compute thread, and its outcome."""

    def __init__(self, call: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]):
        self._call, self._args, self._kwargs = call, args, kwargs
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None

    def run(self) -> None:
        try:
            self._result = self._call(*self._args, **self._kwargs)
        except BaseException as exc:  # re-raised on the caller's thread
            self._error = exc
        self._done.set()

    def outcome(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._result


class CpuThread:
    """The process's one CPU compute thread: it runs other threads' calls in turn, and
    the engine loop of one model at a time (`engine_thread`), whose calls run in place."""

    def __init__(self) -> None:
        self._calls: deque[_Call] = deque()
        self._lock = threading.Lock()
        # Set by a queued call, a loop to host, or the hosted engine's wake.
        self._signal = threading.Event()
        self._hosted: HostedLoop | None = None
        self._loop: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._serve, name=_NAME, daemon=True)
        self._thread.start()

    def __call__(self, call: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        if threading.get_ident() == self._thread.ident:
            self.serve_calls()
            return call(*args, **kwargs)
        queued = _Call(call, args, kwargs)
        with self._lock:
            self._calls.append(queued)
        self._signal.set()
        result: R = queued.outcome()
        return result

    def engine_thread(self, name: str) -> HostedLoop | None:
        """This thread for an engine's loop, unless another engine's loop has it."""
        with self._lock:
            if self._hosted is not None:
                return None
            self._hosted = HostedLoop(self, name)
            return self._hosted

    def serve_calls(self) -> None:
        """On this thread: run the calls queued so far, oldest first (those queued
        meanwhile wait for the next turn, so the hosted loop's own call comes soon)."""
        with self._lock:
            calls, self._calls = self._calls, deque()
        for queued in calls:
            queued.run()

    def idle(self, hosted: HostedLoop, seconds: float) -> None:
        """The hosted loop's wait: serve calls until it is woken or `seconds` pass."""
        deadline = time.monotonic() + seconds
        while True:
            self._signal.clear()  # before looking, so that a later signal is kept
            self.serve_calls()
            if hosted.take_wake():
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._signal.wait(remaining)

    def host(self, loop: Callable[[], None]) -> None:
        with self._lock:
            self._loop = loop
        self._signal.set()

    def signal(self) -> None:
        self._signal.set()

    def _serve(self) -> None:
        while True:
            self._signal.wait()
            self._signal.clear()
            self.serve_calls()
            with self._lock:
                loop, self._loop = self._loop, None
                hosted = self._hosted
            if loop is None or hosted is None:
                continue
            self._thread.name = hosted.name
            try:
                loop()
            finally:
                self._thread.name = _NAME
                with self._lock:
                    self._hosted = None
                hosted.finished()


class HostedLoop:
    """An engine's loop on the compute thread (an EngineThread)."""

    def __init__(self, cpu: CpuThread, name: str) -> None:
        self._cpu = cpu
        self.name = name
        self._woken = threading.Event()
        self._started = False
        self._done = threading.Event()

    def start(self, loop: Callable[[], None]) -> None:
        self._started = True
        self._cpu.host(loop)

    def wake(self) -> None:
        self._woken.set()
        self._cpu.signal()

    def take_wake(self) -> bool:
        """Whether a wake came since the last one taken (wakes in between merge)."""
        if not self._woken.is_set():
            return False
        self._woken.clear()
        return True

    def idle(self, seconds: float) -> None:
        self._cpu.idle(self, seconds)

    def join(self) -> None:
        if self._started:
            self._done.wait()

    def is_alive(self) -> bool:
        return self._started and not self._done.is_set()

    def finished(self) -> None:
        self._done.set()


_cpu_thread: CpuThread | None = None
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
            _cpu_thread = CpuThread()
        return _cpu_thread
