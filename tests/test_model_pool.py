"""The model pool on real models: LRU with active streams, TTL expiry, load once, failed loads."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kronk_caching.none import NoCache
from kronk_core import Kronk, KronkConfig, hookimpl
from kronk_core.contract.cache import PromptScope
from kronk_core.contract.errors import ModelLoadError, ModelNotFoundError, PoolBusyError
from kronk_core.contract.records import RequestRecord
from kronk_core.contract.types import ChatMessage
from kronk_core.runtime.pool import LoadState
from kronk_core.sdk import LoadedModel
from kronk_core.settings.config import ModelConfig
from kronk_testing.waiting import gated, wait_until


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


def spy_leases(kronk: Kronk, model_id: str) -> threading.Event:
    """An event set when a request asks the pool for `model_id` (before it waits for room)."""
    asked = threading.Event()
    lease = kronk.pool.lease

    def spying(wanted: str, **options: Any) -> Any:
        if wanted == model_id:
            asked.set()
        return lease(wanted, **options)

    kronk.pool.lease = spying  # type: ignore[method-assign]
    return asked


async def test_full_pool_waits_for_the_active_stream(
    tmp_path: Path, models: dict[str, ModelConfig]
) -> None:
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
        loaded = kronk.load("tiny")
        assert isinstance(loaded, LoadedModel)
        asked = spy_leases(kronk, "minilm")
        with gated(loaded.engine) as gate:
            stream = await kronk.start_chat(
                kronk.chat_request(
                    [{"role": "user", "content": "Count to fifty."}],
                    model="tiny",
                    max_tokens=8,
                    temperature=0,
                )
            )
            assert await asyncio.to_thread(gate.held.wait, 60)  # running, held after one step
            embedding = asyncio.ensure_future(kronk.embed("wait for me", model="minilm"))
            assert await asyncio.to_thread(asked.wait, 60)  # minilm's request is at the pool
            assert gate.held.is_set() and not finished
            assert not embedding.done()
            assert [model_id for model_id, _ in loads] == ["tiny"]
            gate.release()
            finish = None
            async for delta in stream:
                finish = delta.finish_reason or finish
        assert finish is not None and finish.value in ("length", "stop")  # not cut short
        assert len((await embedding).vectors[0]) == 384
        assert [model_id for model_id, _ in loads] == ["tiny", "minilm"]
        assert loads[1][1] >= finished[0]  # minilm loaded only after tiny's request ended
        assert kronk.pool.get("tiny") is None and kronk.pool.get("minilm") is not None


async def test_full_pool_gives_up_after_the_wait(
    tmp_path: Path, models: dict[str, ModelConfig]
) -> None:
    with _kronk(tmp_path, models, models_in_cache=1, queue_wait_seconds=0.3) as kronk:
        loaded = kronk.load("tiny")
        assert isinstance(loaded, LoadedModel)
        with gated(loaded.engine) as gate:
            stream = await kronk.start_chat(
                kronk.chat_request(
                    [{"role": "user", "content": "hi"}], model="tiny", max_tokens=8, temperature=0
                )
            )
            assert await asyncio.to_thread(gate.held.wait, 60)  # running, and held there
            with pytest.raises(PoolBusyError, match="models_in_cache") as caught:
                await kronk.embed("no room", model="minilm")
            assert caught.value.status == 503
            stream.cancel()


async def test_idle_model_expires_after_the_ttl(
    tmp_path: Path, models: dict[str, ModelConfig]
) -> None:
    with _kronk(tmp_path, models, cache_ttl="300ms") as kronk:
        # Held, the model cannot expire however slow this machine is; its TTL counts from
        # the release.
        with await kronk.lease("minilm"):
            await kronk.embed("short lived", model="minilm")
            assert kronk.pool.get("minilm") is not None
        deadline = time.monotonic() + 60  # a safety net: the loop ends when it unloads
        while kronk.pool.get("minilm") is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert kronk.pool.get("minilm") is None
        # It loads again on the next request.
        assert (await kronk.embed("back again", model="minilm")).vectors


async def test_keep_alive_gives_one_model_its_own_ttl(
    tmp_path: Path, models: dict[str, ModelConfig]
) -> None:
    # cache_ttl 0: no model expires, so no sweeper runs until a keep_alive asks for one.
    with _kronk(tmp_path, models, cache_ttl=0) as kronk:
        kronk.load("minilm", keep=True)
        await kronk.aload("tiny")
        [entry] = [e for e in kronk.pool.entries() if e.model_id == "minilm"]
        assert entry.ttl_left is None
        kronk.pool.keep_alive("minilm", 600)
        [entry] = [e for e in kronk.pool.entries() if e.model_id == "minilm"]
        assert entry.ttl_left is not None and 590 < entry.ttl_left <= 600
        kronk.pool.keep_alive("minilm", 0)
        await wait_until(lambda: kronk.pool.get("minilm") is None)
        assert kronk.pool.get("tiny") is not None  # the others keep the server's rule
        # A negative keep_alive (None) keeps the model until the pool needs its place.
        kronk.pool.keep_alive("tiny", None)
        [entry] = kronk.pool.entries()
        assert entry.ttl_left is None
        kronk.pool.keep_alive("absent", 0)  # not loaded: nothing to do


async def test_concurrent_first_requests_load_once(
    tmp_path: Path, models: dict[str, ModelConfig]
) -> None:
    requests = 5
    with _kronk(tmp_path, models) as kronk:
        loads: list[str] = []
        arrived = threading.Semaphore(0)
        real_load = kronk.pool._load
        lease = kronk.pool.lease

        def counting(model_id: str, **options: Any) -> Any:
            arrived.release()
            return lease(model_id, **options)

        def loading(model_id: str) -> Any:
            loads.append(model_id)
            for _ in range(requests):  # every request has reached the pool: none finds it loaded
                assert arrived.acquire(timeout=60)
            return real_load(model_id)

        kronk.pool.lease = counting  # type: ignore[method-assign]
        kronk.pool._load = loading
        results = await asyncio.gather(
            *(kronk.embed(f"text {i}", model="minilm") for i in range(requests))
        )
        assert loads == ["minilm"]
        assert len({tuple(r.vectors[0]) for r in results}) == requests


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


def test_failed_loads_are_remembered_within_a_bound(
    tmp_path: Path, models: dict[str, ModelConfig]
) -> None:
    """Requests may name any number of missing models; the pool's memory of failures stays small."""
    with _kronk(tmp_path, models) as kronk:
        for n in range(20):
            with pytest.raises(ModelNotFoundError):
                kronk.load(f"missing-{n}")
        state, error = kronk.pool.state("missing-19")
        assert state is LoadState.failed and isinstance(error, ModelNotFoundError)
        assert kronk.pool.state("missing-0") == (LoadState.not_loaded, None)
        remembered = [kronk.pool.state(f"missing-{n}")[0] for n in range(20)]
        assert remembered.count(LoadState.failed) == 16
        kronk.load("tiny")
        assert kronk.pool.state("tiny") == (LoadState.loaded, None)


def test_failed_context_frees_the_weights(tmp_path: Path, minilm_path: Path) -> None:
    """A context llama.cpp cannot create (absurd window) fails the load; nothing stays behind."""
    huge = ModelConfig(model_path=minilm_path, context_window=1 << 40)
    before = threading.active_count()
    with _kronk(tmp_path, {"huge": huge}) as kronk, pytest.raises(ModelLoadError):
        kronk.load("huge")
    assert threading.active_count() <= before + 1  # only the pool's TTL thread


class HeldPrompts(NoCache):
    """A cache strategy whose prompt step (run in the request's worker thread) waits for
    `go`: the thread is in the middle of preparing a prompt for as long as a test needs."""

    name = "held-prompts"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.go = threading.Event()

    def prompt_messages(
        self, messages: Sequence[ChatMessage], scope: PromptScope
    ) -> Sequence[ChatMessage]:
        self.entered.set()
        self.go.wait(60)
        return messages


class HeldPromptsPlugin:
    def __init__(self) -> None:
        self.strategy = HeldPrompts()

    @hookimpl
    def kronk_register_cache_strategies(self, register: Any) -> None:
        register("held-prompts", lambda **_: self.strategy)


async def test_a_caller_that_gives_up_leaves_its_model_leased_until_its_thread_is_done(
    tmp_path: Path, models: dict[str, ModelConfig]
) -> None:
    """A prompt is prepared in a worker thread; a cancelled caller releases its lease, so the
    thread holds one of its own: neither the TTL nor the LRU rule unloads the model under it."""
    plugin = HeldPromptsPlugin()
    tiny = models["tiny"].model_copy(update={"cache": "held-prompts"})
    with _kronk(tmp_path, {"tiny": tiny}, plugins={"held": plugin}, cache_ttl="50ms") as kronk:
        chat = asyncio.create_task(kronk.chat([{"role": "user", "content": "hi"}], model="tiny"))
        assert await asyncio.to_thread(plugin.strategy.entered.wait, 60)
        chat.cancel()
        with pytest.raises(asyncio.CancelledError):
            await chat
        (entry,) = kronk.pool.entries()
        assert entry.leases == 1  # the thread's, not the caller's
        plugin.strategy.go.set()
        await wait_until(lambda: not kronk.pool.entries(), timeout=60)  # then the TTL applies
