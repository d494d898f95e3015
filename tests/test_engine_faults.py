"""Faults inside the engine: each fails only the requests it touched, in their dialect's shape;
the other requests, the engine and the server go on, and nothing leaks.

The real failures (llama.cpp finding no KV cell for one slot's tokens, a
compute error, an exception deep inside a step) cannot be provoked on
demand, so a test plugin wraps the real llamacpp model and the real IMC
strategy. A sequence is poisoned once a batch holds the poison token in it;
the fault fires on the `at`-th decode holding a poisoned sequence (1: its
prompt, before any answer; 4: after three tokens have been streamed).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from kronk_api import ServerSettings, create_app
from kronk_caching.plugin import incremental_cache
from kronk_core import Kronk, KronkConfig, ModelConfig, hookimpl
from kronk_core.contract.backend import Backend, Batch, ModelInfo, TextModel
from kronk_core.contract.cache import CachePlan, CacheStrategy, CacheStrategyFactory, Slot
from kronk_core.contract.errors import KronkError, KVCacheFullError
from kronk_core.contract.generation import GenerationRequest
from kronk_core.contract.registry import Register
from kronk_core.contract.sampling import SamplerStage
from kronk_core.runtime.engine import Engine
from kronk_llamacpp.backend import LlamaCppBackend
from kronk_llamacpp.model import decode_error
from kronk_llamacpp.packaged import GEMMA_MODEL_ID, GEMMA_MODEL_SETTINGS
from kronk_testing.waiting import gated, wait_idle, wait_until

if TYPE_CHECKING:
    from kronk_testing.server import Serve

POISON_WORD = " zyzzyva"


@dataclass(frozen=True)
class Fault:
    # kv_full: llama_decode status 1; crash: an exception inside the decode; sample: one
    # inside the sampler; prepare: one inside the cache strategy as the request starts.
    kind: str
    at: int = 1


class Faults:
    """What the plugin injects now; the test sets it."""

    def __init__(self) -> None:
        self.fault: Fault | None = None
        # Every decode fails (a compute error) while set.
        self.broken = False
        self.fired = 0


class FaultySampler:
    def __init__(self, sampler: Any, model: FaultyModel) -> None:
        self._sampler = sampler
        self._model = model

    def sample(self, batch_index: int) -> int:
        fault = self._model.faults.fault
        if fault is not None and fault.kind == "sample":
            seq_id = self._model.last_batch.seq_ids[batch_index]
            if self._model.poisoned.get(seq_id, 0) >= fault.at:
                self._model.faults.fired += 1
                raise RuntimeError("injected: the sampler crashed")
        token: int = self._sampler.sample(batch_index)
        return token

    def close(self) -> None:
        self._sampler.close()


class FaultyModel:
    """The real model; its decodes and samplers fail as `faults` says."""

    def __init__(self, model: TextModel, faults: Faults) -> None:
        self._model = model
        self.info = model.info
        self.faults = faults
        self.poison = model.tokenize(POISON_WORD, add_special=False, parse_special=False)[-1]
        # Poisoned sequence → decodes that held it.
        self.poisoned: dict[int, int] = {}
        self.last_batch = Batch()

    def decode(self, batch: Batch) -> None:
        faults = self.faults
        if faults.broken:
            faults.fired += 1
            raise decode_error(-3)
        for token, seq_id in zip(batch.tokens, batch.seq_ids, strict=True):
            if token == self.poison:
                self.poisoned.setdefault(seq_id, 0)
        held = {seq_id for seq_id in batch.seq_ids if seq_id in self.poisoned}
        for seq_id in held:
            self.poisoned[seq_id] += 1
        fault = faults.fault
        if fault is not None and any(self.poisoned[seq_id] >= fault.at for seq_id in held):
            if fault.kind == "kv_full":
                faults.fired += 1
                raise decode_error(1)
            if fault.kind == "crash":
                faults.fired += 1
                raise ValueError("injected: a crash inside the decode")
        self._model.decode(batch)
        self.last_batch = batch

    def new_sampler(
        self, stages: Sequence[SamplerStage], *, seq_id: int | None = None, logits: bool = True
    ) -> FaultySampler:
        return FaultySampler(self._model.new_sampler(stages, seq_id=seq_id, logits=logits), self)

    def seq_remove(self, seq_id: int, start: int, end: int) -> bool:
        if start == 0:
            self.poisoned.pop(seq_id, None)
        return self._model.seq_remove(seq_id, start, end)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class FaultyCache:
    """The real IMC strategy, except that preparing a poisoned prompt may crash."""

    def __init__(self, inner: CacheStrategy, faults: Faults, poison: int) -> None:
        self._inner = inner
        self._faults = faults
        self._poison = poison

    def prepare(
        self, slot: Slot, request: GenerationRequest, model: TextModel, slots: Sequence[Slot]
    ) -> CachePlan:
        fault = self._faults.fault
        if fault is not None and fault.kind == "prepare" and self._poison in request.prompt_tokens:
            self._faults.fired += 1
            raise OSError("injected: the cache strategy crashed")
        return self._inner.prepare(slot, request, model, slots)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class FaultyBackend(LlamaCppBackend):
    """llama.cpp's backend, its text models wrapped to fail on demand."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults
        self.models: list[FaultyModel] = []

    def load_model(self, config: ModelConfig) -> Any:
        model = FaultyModel(super().load_model(config), self.faults)  # type: ignore[arg-type]
        self.models.append(model)
        return model


class FaultyPlugin:
    def __init__(self) -> None:
        self.faults = Faults()
        self.backend = FaultyBackend(self.faults)

    @hookimpl
    def kronk_register_backends(self, register: Register[Backend]) -> None:
        register("llamacpp", self.backend)  # called before the llamacpp plugin: its name

    @hookimpl
    def kronk_register_cache_strategies(self, register: Register[CacheStrategyFactory]) -> None:
        def faulty(*, model_config: ModelConfig, model_info: ModelInfo) -> CacheStrategy:
            inner = incremental_cache(model_config=model_config, model_info=model_info)
            poison = self.backend.models[-1].poison
            return FaultyCache(inner, self.faults, poison)  # type: ignore[return-value]

        register("faulty", faulty)


HEALTHY = ["1, 2, 3, 4, 5, 6, 7, 8,", "Monday, Tuesday, Wednesday,"]
POISONED = f"Say{POISON_WORD} twice, then count to ten."
MAX_TOKENS = 12


@dataclass
class Server:
    base_url: str
    kronk: Kronk
    plugin: FaultyPlugin
    engine: Engine
    # Each healthy prompt's answer, computed alone before any fault.
    reference: dict[str, str]


def body(prompt: str, stream: bool = False, dialect: str = "openai") -> dict[str, Any]:
    if dialect == "ollama":
        options = {"num_predict": MAX_TOKENS, "temperature": 0}
        messages = [{"role": "user", "content": prompt}]
        return {"model": GEMMA_MODEL_ID, "messages": messages, "options": options, "stream": stream}
    return {
        "model": GEMMA_MODEL_ID,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": stream,
    }


PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}
# Ollama's chat, for the faults of one request (its streams are NDJSON, its errors untyped).
FAULT_PATHS = {**PATHS, "ollama": "/api/chat"}


def answer_text(dialect: str, response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    data = response.json()
    if dialect == "openai":
        content: str = data["choices"][0]["message"]["content"]
        return content
    return "".join(block["text"] for block in data["content"])


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, gemma_path: str, serve: Serve
) -> Iterator[Server]:
    plugin = FaultyPlugin()
    settings = {
        **GEMMA_MODEL_SETTINGS,
        "model_path": gemma_path,
        "cache": "faulty",
        # The gate holds requests mid-answer: drafts could finish one inside a step.
        "draft_strategy": "none",
        "context_window": 1024,
        "n_seq_max": 3,
        "sampling": {"dry_multiplier": 0.0},
    }
    config = KronkConfig(
        base_path=tmp_path_factory.mktemp("faults"),
        default_model=GEMMA_MODEL_ID,
        models={GEMMA_MODEL_ID: ModelConfig.model_validate(settings)},
    )
    kronk = Kronk(config, plugins={"faulty": plugin})
    loaded = kronk.get_loaded() or kronk.load()
    engine = loaded.engine  # type: ignore[union-attr]
    with serve(create_app(ServerSettings(), kronk=kronk)) as base_url:
        reference = {}
        with httpx.Client(base_url=base_url, timeout=120) as http:
            for prompt in HEALTHY:
                reference[prompt] = answer_text(
                    "openai", http.post(PATHS["openai"], json=body(prompt))
                )
        yield Server(base_url, kronk, plugin, engine, reference)


def assert_clean(engine: Engine) -> None:
    """No slot, queue place or request is left behind, and the engine still runs."""
    stats = engine.stats()
    assert (stats.active, stats.queued) == (0, 0)
    assert not any(slot.busy or slot.pending for slot in engine.slots)
    assert engine.alive


def sse_events(raw: str) -> list[tuple[str | None, dict[str, Any]]]:
    """(event name, data) of each server-sent event with JSON data."""
    events: list[tuple[str | None, dict[str, Any]]] = []
    for frame in raw.split("\n\n"):
        name, data = None, None
        for line in frame.splitlines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: ") and line != "data: [DONE]":
                data = json.loads(line.removeprefix("data: "))
        if data is not None:
            events.append((name, data))
    return events


def dialect_error(dialect: str, response: httpx.Response) -> tuple[int, str, str]:
    """(status, error type, message) of an error answered before or inside a stream."""
    assert "Traceback" not in response.text
    if dialect == "ollama":  # {"error": message}, or that object as the stream's last line
        lines = [json.loads(line) for line in response.text.splitlines() if line]
        assert list(lines[-1]) == ["error"] and not any(line.get("done") for line in lines)
        if response.status_code == 200:
            assert any(line.get("message", {}).get("content") for line in lines[:-1])
        return response.status_code, "", lines[-1]["error"]
    if response.status_code != 200:
        error = response.json()["error"]
        if dialect == "anthropic":
            assert response.json()["type"] == "error"
        return response.status_code, error["type"], error["message"]
    events = sse_events(response.text)
    name, last = events[-1]
    assert "[DONE]" not in response.text and "message_stop" not in response.text
    if dialect == "anthropic":
        assert name == "error" and last["type"] == "error"
        # Text came before the error: it broke off a running answer.
        assert any(data.get("type") == "content_block_delta" for _, data in events)
    else:
        assert any(data.get("choices") for _, data in events)
    return 200, last["error"]["type"], last["error"]["message"]


# (fault, dialect, streamed, expected status, expected error type)
CASES = [
    (Fault("kv_full"), "openai", False, 503, "service_unavailable"),
    (Fault("kv_full", at=4), "anthropic", True, 200, "overloaded_error"),
    (Fault("crash"), "anthropic", False, 500, "api_error"),
    (Fault("crash", at=4), "openai", True, 200, "server_error"),
    (Fault("sample"), "openai", False, 500, "server_error"),
    (Fault("sample", at=3), "anthropic", True, 200, "api_error"),
    (Fault("prepare"), "anthropic", True, 500, "api_error"),
    (Fault("prepare"), "openai", False, 500, "server_error"),
    (Fault("kv_full", at=4), "ollama", True, 200, ""),
    (Fault("kv_full"), "ollama", False, 503, ""),
    (Fault("sample", at=3), "ollama", True, 200, ""),
]


@pytest.mark.parametrize(
    ("fault", "dialect", "streamed", "status", "error_type"),
    CASES,
    ids=[f"{c[0].kind}@{c[0].at}-{c[1]}-{'stream' if c[2] else 'whole'}" for c in CASES],
)
async def test_a_fault_fails_only_the_request_it_touched(
    server: Server, fault: Fault, dialect: str, streamed: bool, status: int, error_type: str
) -> None:
    engine, faults = server.engine, server.plugin.faults
    await wait_idle(engine)
    faults.fault, faults.fired = fault, 0
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        try:
            # The first healthy request runs; the poisoned one and the second healthy one
            # join it in the same steps once the engine goes on.
            with gated(engine) as gate:
                first = asyncio.ensure_future(http.post(PATHS["openai"], json=body(HEALTHY[0])))
                await gate.wait_held()
                poisoned = asyncio.ensure_future(
                    http.post(FAULT_PATHS[dialect], json=body(POISONED, streamed, dialect))
                )
                second = asyncio.ensure_future(http.post(PATHS["anthropic"], json=body(HEALTHY[1])))
                await wait_until(lambda: engine.stats().queued == 2)
            answers = await asyncio.gather(first, poisoned, second)
        finally:
            faults.fault = None
    assert faults.fired >= 1
    got_status, got_type, message = dialect_error(dialect, answers[1])
    assert (got_status, got_type) == (status, error_type), message
    if fault.kind == "kv_full":
        assert "KV cache has no room" in message
        if status == 503:
            assert answers[1].headers["retry-after"] == "1"
    else:  # an internal fault: the details stay in the log
        assert message.startswith("internal: ")
    assert answer_text("openai", answers[0]) == server.reference[HEALTHY[0]]
    assert answer_text("anthropic", answers[2]) == server.reference[HEALTHY[1]]
    await wait_idle(engine)
    assert_clean(engine)
    again = httpx.post(f"{server.base_url}{PATHS['openai']}", json=body(HEALTHY[0]), timeout=120)
    assert answer_text("openai", again) == server.reference[HEALTHY[0]]


async def test_a_failing_decode_fails_every_running_request_then_the_server_recovers(
    server: Server,
) -> None:
    """A compute error on every decode: each running stream ends with an error event."""
    engine, faults = server.engine, server.plugin.faults
    await wait_idle(engine)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        with gated(engine, lambda record: len(record.generating) == 2) as gate:
            streams = [
                asyncio.ensure_future(http.post(PATHS[dialect], json=body(prompt, True)))
                for dialect, prompt in zip(PATHS, HEALTHY, strict=True)
            ]
            await gate.wait_held()
            faults.broken = True
        try:
            answers = await asyncio.gather(*streams)
        finally:
            faults.broken = False
    for dialect, answer in zip(PATHS, answers, strict=True):
        _, error_type, message = dialect_error(dialect, answer)
        assert error_type in ("server_error", "api_error") and message.startswith("internal: ")
    await wait_idle(engine)
    assert_clean(engine)
    again = httpx.post(f"{server.base_url}{PATHS['anthropic']}", json=body(HEALTHY[1]), timeout=120)
    assert answer_text("anthropic", again) == server.reference[HEALTHY[1]]


async def test_a_refused_decode_fails_only_its_request_in_the_sdk(server: Server) -> None:
    """The SDK raises the error itself: KVCacheFullError, 503, with a retry hint."""
    kronk, faults = server.kronk, server.plugin.faults
    await wait_idle(server.engine)
    faults.fault = Fault("kv_full")
    try:
        with pytest.raises(KronkError) as caught:
            await kronk.chat([{"role": "user", "content": POISONED}], max_tokens=4)
    finally:
        faults.fault = None
    assert isinstance(caught.value, KVCacheFullError)
    assert (caught.value.status, caught.value.retry_after) == (503, 1)
    await wait_idle(server.engine)
    assert_clean(server.engine)


async def test_a_model_file_deleted_while_loaded(
    tmp_path: Path, gemma_path: str, serve: Serve
) -> None:
    """The loaded model keeps serving (its weights are mapped); once unloaded, a request
    gets a clear error in its dialect's shape, the server's other models serve on, and a
    restored file loads again."""
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(Path(gemma_path).read_bytes())
    models = {
        "copy": ModelConfig(model_path=copy, context_window=512, n_seq_max=1),
        "other": ModelConfig(model_path=Path(gemma_path), context_window=512, n_seq_max=1),
    }
    kronk = Kronk(KronkConfig(base_path=tmp_path, models=models, default_model="copy"))
    chat = {
        "model": "copy",
        "messages": [{"role": "user", "content": HEALTHY[0]}],
        "max_tokens": 8,
        "temperature": 0,
    }
    with serve(create_app(ServerSettings(), kronk=kronk)) as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
            before = answer_text("openai", await http.post(PATHS["openai"], json=chat))
            copy.unlink()
            after = answer_text("openai", await http.post(PATHS["openai"], json=chat))
            assert after == before
            loaded = kronk.get_loaded("copy")
            assert loaded is not None
            await wait_idle(loaded.engine)
            assert_clean(loaded.engine)
            assert (await http.get("/v1/readiness")).status_code == 200
            await kronk.aunload("copy")
            for dialect in PATHS:
                gone = await http.post(PATHS[dialect], json=chat)
                assert gone.status_code == 500, gone.text
                assert "Traceback" not in gone.text and str(copy) not in gone.text
                if dialect == "openai":
                    assert gone.json()["error"]["code"] == "config_error", gone.text
                else:
                    assert gone.json()["error"]["type"] == "api_error", gone.text
            other = await http.post(PATHS["openai"], json={**chat, "model": "other"})
            assert answer_text("openai", other) == before
            copy.write_bytes(Path(gemma_path).read_bytes())  # the operator puts it back
            back = await http.post(PATHS["openai"], json=chat)
            assert answer_text("openai", back) == before
