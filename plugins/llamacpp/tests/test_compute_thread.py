"""Models on the CPU compute on one shared thread where llama.cpp uses OpenMP
(kronk_llamacpp/compute.py): a second model's engine thread adds no OpenMP worker pool,
and the first model's engine loop runs on that thread, so its decodes need no hand-over.

OpenMP gives every thread that computes a pool of n_threads - 1 workers; the threads of
this process are counted in /proc/self/task while each model's engine thread lives.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from kronk_core import Kronk, KronkConfig
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


@pytest.mark.skipif(not uses_openmp(), reason="this build of llama.cpp has no OpenMP")
async def test_the_first_model_on_the_cpu_runs_its_engine_on_the_compute_thread(
    tmp_path: Path, gemma_path: str, minilm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Model a's engine loop runs on the compute thread (named for its engine meanwhile):
    every decode of a's runs there. Model b's engine and the embedding model queue their
    calls to it, served between a's steps and while a idles, with no OpenMP pool added.
    Once a is unloaded, the thread serves b's calls alone; a loaded again hosts again."""
    decoded_on: list[str] = []
    decode = llama_cpp.llama_decode

    def recorded(*args: Any) -> int:
        decoded_on.append(threading.current_thread().name)
        return int(decode(*args))

    monkeypatch.setattr(llama_cpp, "llama_decode", recorded)
    models = {
        name: {"model_path": gemma_path, "context_window": 512, "n_seq_max": 1,
               "llamacpp": {"n_threads": THREADS}}
        for name in ("a", "b")
    }  # fmt: skip
    models["e"] = {"model_path": minilm_path, "llamacpp": {"n_threads": THREADS}}
    kronk = Kronk(KronkConfig.model_validate({"base_path": tmp_path, "models": models}))

    async def answers(model: str, tokens: int = 6) -> int:
        result = await kronk.complete("The capital of France is", model=model, max_tokens=tokens)
        return result.usage.completion_tokens

    with kronk:
        assert await answers("a") == 6
        assert set(decoded_on) == {"kronk-engine-a"}
        # Threads that Python does not know: OpenMP's workers among them.
        native = threads_now() - threading.active_count()
        decoded_on.clear()
        busy, quiet, embedded = await asyncio.wait_for(
            asyncio.gather(answers("a", 24), answers("b"), kronk.embed("hello", model="e")),
            timeout=120,
        )
        assert (busy, quiet, len(embedded.vectors)) == (24, 6, 1)
        # A second OpenMP pool would add a worker.
        assert threads_now() - threading.active_count() == native
        assert set(decoded_on) == {"kronk-engine-a"}
        decoded_on.clear()  # a idles: its wait serves b's calls
        assert await asyncio.wait_for(answers("b"), timeout=60) == 6
        assert set(decoded_on) == {"kronk-engine-a"}
        await kronk.aunload("a")
        decoded_on.clear()
        assert await asyncio.wait_for(answers("b"), timeout=60) == 6
        assert set(decoded_on) == {"kronk-llama-cpu"}
        decoded_on.clear()
        assert await answers("a") == 6
        assert set(decoded_on) == {"kronk-engine-a"}
