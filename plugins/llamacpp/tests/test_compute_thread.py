"""Models on the CPU compute on one shared thread where llama.cpp uses OpenMP
(kronk_llamacpp/compute.py): a second model's engine thread adds no OpenMP worker pool,
and the first model's engine loop runs on that thread, so its decodes need no hand-over.

OpenMP gives every thread that computes a pool of n_threads - 1 workers; the threads of
this process are counted in /proc/self/task while each model's engine thread lives.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kronk_core.contract.backend import Batch
from kronk_core.settings.config import ModelConfig
from kronk_llamacpp.compute import computes_on_cpu, runner, uses_openmp
from kronk_llamacpp.model import LlamaTextModel

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2,
    reason="threads are counted in Linux's /proc; OpenMP has no workers on one core",
)

THREADS = 2  # each computing thread's OpenMP pool: one worker besides itself


def threads_now() -> int:
    return len(os.listdir("/proc/self/task"))


def config(path: str, model_id: str) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "id": model_id,
            "model_path": path,
            "context_window": 512,
            "n_seq_max": 1,
            "llamacpp": {"n_threads": THREADS},
        }
    )


def decode_some(model: LlamaTextModel) -> None:
    model.seq_remove(0, 0, -1)
    batch = Batch()
    for position in range(16):
        batch.add(1000 + position, position, 0, position == 15)
    model.decode(batch)


class EngineThread:
    """A thread that decodes on a model when asked, and stays until closed (an engine)."""

    def __init__(self, model: LlamaTextModel) -> None:
        self._model = model
        self._asked = threading.Semaphore(0)
        self._done = threading.Semaphore(0)
        self._closing = False
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._asked.acquire()
            if self._closing:
                return
            try:
                decode_some(self._model)
            except BaseException as exc:
                self._failed = exc
            self._done.release()

    def decode(self) -> None:
        self._asked.release()
        assert self._done.acquire(timeout=120)
        if self._failed is not None:
            raise self._failed

    def close(self) -> None:
        self._closing = True
        self._asked.release()
        self._thread.join()


@pytest.fixture
def engines(gemma_path: str) -> Iterator[Callable[[str], EngineThread]]:
    made: list[tuple[LlamaTextModel, EngineThread]] = []

    def make(model_id: str) -> EngineThread:
        model = LlamaTextModel(config(gemma_path, model_id))
        engine = EngineThread(model)
        made.append((model, engine))
        return engine

    yield make
    for model, engine in made:
        engine.close()
        model.close()


@pytest.mark.skipif(not uses_openmp(), reason="this build of llama.cpp has no OpenMP")
def test_a_second_model_on_the_cpu_adds_no_openmp_pool(
    gemma_path: str, engines: Callable[[str], EngineThread]
) -> None:
    assert computes_on_cpu(config(gemma_path, "a"))
    first = engines("a")
    first.decode()  # the shared compute thread and its pool exist from here on
    before = threads_now()
    second = engines("b")
    assert threads_now() == before + 1  # its engine thread
    second.decode()
    first.decode()
    # Each model's own compute thread would have added a worker of its own.
    assert threads_now() == before + 1
    assert runner(config(gemma_path, "a")) is runner(config(gemma_path, "b"))


# In a process of its own: the CPU thread hosts the first CPU model's engine of the
# process, which in a test session may be another test's model.
FIRST_MODEL_HOSTS = r"""
import asyncio, os, sys, threading
import llama_cpp
from kronk_core import Kronk, KronkConfig

gemma, minilm, base = sys.argv[1:4]
decoded_on = []
decode = llama_cpp.llama_decode

def recorded(*args):
    decoded_on.append(threading.current_thread().name)
    return decode(*args)

llama_cpp.llama_decode = recorded
engine = {"model_path": gemma, "context_window": 512, "n_seq_max": 1,
          "llamacpp": {"n_threads": 2}}
models = {"a": engine, "b": engine, "e": {"model_path": minilm, "llamacpp": {"n_threads": 2}}}
kronk = Kronk(KronkConfig.model_validate({"base_path": base, "models": models}))

def native_threads():  # threads Python does not know: OpenMP's workers among them
    return len(os.listdir("/proc/self/task")) - threading.active_count()

async def answers(model, tokens=6):
    result = await kronk.complete("The capital of France is", model=model, max_tokens=tokens)
    return result.usage.completion_tokens

def decoded_by(name):
    names = set(decoded_on)
    decoded_on.clear()
    assert names == {name}, names

async def main():
    assert await answers("a") == 6
    decoded_by("kronk-engine-a")
    native = native_threads()
    together = asyncio.gather(answers("a", 24), answers("b"), kronk.embed("hi", model="e"))
    busy, quiet, embedded = await asyncio.wait_for(together, timeout=120)
    assert (busy, quiet, len(embedded.vectors)) == (24, 6, 1)
    assert native_threads() == native  # a second OpenMP pool would add a worker
    decoded_by("kronk-engine-a")
    assert await asyncio.wait_for(answers("b"), timeout=60) == 6  # a idles meanwhile
    decoded_by("kronk-engine-a")
    await kronk.aunload("a")
    assert await asyncio.wait_for(answers("b"), timeout=60) == 6
    decoded_by("kronk-llama-cpu")
    assert await answers("a") == 6
    decoded_by("kronk-engine-a")

with kronk:
    asyncio.run(main())
print("hosted as expected")
"""


@pytest.mark.skipif(not uses_openmp(), reason="this build of llama.cpp has no OpenMP")
def test_the_first_model_on_the_cpu_runs_its_engine_on_the_compute_thread(
    tmp_path: Path, gemma_path: str, minilm_path: Path
) -> None:
    """Model a's engine loop runs on the compute thread (named for its engine meanwhile):
    every decode of a's runs there. Model b's engine and the embedding model queue their
    calls to it, served between a's steps and while a idles, with no OpenMP pool added.
    Once a is unloaded, the thread serves b's calls alone; a loaded again hosts again."""
    done = subprocess.run(
        [sys.executable, "-c", FIRST_MODEL_HOSTS, gemma_path, str(minilm_path), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "hosted as expected" in done.stdout
