"""The model pool on real models: LRU with active streams, TTL expiry, load once, failed loads."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kronk_core import Kronk, KronkConfig, hookimpl
from kronk_core.config import ModelConfig
from kronk_core.errors import ModelLoadError, PoolBusyError
from kronk_core.events import RequestRecord


@contextmanager
def _kronk(
    tmp_path: Path, models: dict[str, ModelConfig], plugins: Any = None, **settings: Any
) -> Iterator[Kronk]:
    config = KronkConfig(base_path=tmp_path, models=models, **settings)
    instance = Kronk(config, plugins=plugins)
    try:
        yield instance
    finally:
        instance.close()


@pytest.fixture
def models(tiny_llama_path: Path, minilm_path: Path) -> dict[str, ModelConfig]:
    return {
        "tiny": ModelConfig(
            model_path=tiny_llama_path, templates={"template": "chatml"}, context_window=256
        ),
        "minilm": ModelConfig(model_path=minilm_path),
    }


async def test_full_pool_waits_for_the_active_stream(
    tmp_path: Path, models: dict[str, ModelConfig], gemma_path: str
) -> None:
    # Gemma, not the tiny model: its stream must outlast the checks below (~30 tokens/s here).
    gemma = ModelConfig(model_path=Path(gemma_path), context_window=512)
    models = {**models, "gemma": gemma}
    finished: list[float] = []

    class Probe:
        @hookimpl
        def kronk_request_finished(self, record: RequestRecord) -> None:
            finished.append(time.monotonic())

    probe = {"probe": Probe()}
    with _kronk(tmp_path, models, probe, models_in_cache=1, queue_wait_seconds=60) as kronk:
        loads: list[tuple[str, float]] = []
        real_load = kronk.pool._load

        def timed(model_id: str) -> Any:
            loads.append((model_id, time.monotonic()))
            return real_load(model_id)

        kronk.pool._load = timed
        deltas = aiter(
            kronk.chat_stream(
                [{"role": "user", "content": "Count to fifty."}],
                model="gemma",
                max_tokens=40,
                temperature=0,
            )
        )
        await anext(deltas)  # the stream is running on "gemma"
        embedding = asyncio.ensure_future(kronk.embed("wait for me", model="minilm"))
        await asyncio.sleep(0.3)
        assert not embedding.done()
        assert kronk.get_loaded("gemma") is not None
        finish = None
        async for delta in deltas:
            finish = delta.finish_reason or finish
        assert finish is not None and finish.value == "length"  # the stream was not cut short
        assert len((await embedding).vectors[0]) == 384
        assert [model_id for model_id, _ in loads] == ["gemma", "minilm"]
        assert loads[1][1] >= finished[0]  # minilm loaded only after gemma's request ended
        assert kronk.pool.get("gemma") is None and kronk.pool.get("minilm") is not None


async def test_full_pool_gives_up_after_the_wait(
    tmp_path: Path, models: dict[str, ModelConfig]
) -> None:
    with _kronk(tmp_path, models, models_in_cache=1, queue_wait_seconds=0.3) as kronk:
        stream = await kronk.start_chat(
            kronk.chat_request([{"role": "user", "content": "hi"}], model="tiny", max_tokens=200)
        )
        with pytest.raises(PoolBusyError, match="models_in_cache") as caught:
            await kronk.embed("no room", model="minilm")
        assert caught.value.status == 503
        stream.cancel()


async def test_idle_model_expires_after_the_ttl(
    tmp_path: Path, models: dict[str, ModelConfig]
) -> None:
    with _kronk(tmp_path, models, cache_ttl="300ms") as kronk:
        await kronk.embed("short lived", model="minilm")
        assert kronk.pool.get("minilm") is not None
        deadline = time.monotonic() + 5
        while kronk.pool.get("minilm") is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert kronk.pool.get("minilm") is None
        # It loads again on the next request.
        assert (await kronk.embed("back again", model="minilm")).vectors


async def test_concurrent_first_requests_load_once(
    tmp_path: Path, models: dict[str, ModelConfig]
) -> None:
    with _kronk(tmp_path, models) as kronk:
        loads: list[str] = []
        real_load = kronk.pool._load

        def counting(model_id: str) -> Any:
            loads.append(model_id)
            time.sleep(0.2)  # widen the window in which the others arrive
            return real_load(model_id)

        kronk.pool._load = counting
        results = await asyncio.gather(
            *(kronk.embed(f"text {i}", model="minilm") for i in range(5))
        )
        assert loads == ["minilm"]
        assert len({tuple(r.vectors[0]) for r in results}) == 5


async def test_failed_load_releases_its_place_and_says_why(
    tmp_path: Path, models: dict[str, ModelConfig]
) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF but not really")
    models = {**models, "broken": ModelConfig(model_path=broken)}
    with _kronk(tmp_path, models, models_in_cache=1) as kronk:
        outcomes = await asyncio.gather(
            *(kronk.embed("x", model="broken") for _ in range(3)), return_exceptions=True
        )
        for outcome in outcomes:
            assert isinstance(outcome, ModelLoadError)
            assert "could not load" in outcome.message and "broken.gguf" in outcome.message
        assert kronk.pool.entries() == []
        # The place it held is free again: a good model loads into the one-model pool.
        assert (await kronk.embed("fine", model="minilm")).vectors


def test_failed_context_frees_the_weights(tmp_path: Path, minilm_path: Path) -> None:
    """A context llama.cpp cannot create (absurd window) fails the load; nothing stays behind."""
    huge = ModelConfig(model_path=minilm_path, context_window=1 << 40)
    before = threading.active_count()
    with _kronk(tmp_path, {"huge": huge}) as kronk, pytest.raises(ModelLoadError):
        kronk.load("huge")
    assert threading.active_count() <= before + 1  # only the pool's TTL thread
