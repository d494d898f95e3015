"""Clients that go away, over HTTP: queued requests free their place at once, running ones
stop within one engine step, on every dialect, streaming or not.

The engine is held by a step listener (kronk_testing.waiting.EngineGate) while a client
disconnects, so "at once" means "while the engine cannot have moved": no
wait on the machine's speed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, ModelConfig, hookimpl
from kronk_core.contract.records import ChatRecord, RequestRecord
from kronk_core.runtime.engine import Engine
from kronk_core.runtime.reports import StepRecord
from kronk_llamacpp.packaged import GEMMA_MODEL_SETTINGS
from kronk_testing.waiting import cancelling, gated, wait_idle, wait_until

if TYPE_CHECKING:
    from kronk_testing.server import Serve

MODEL = "m"
SLOTS = 2
QUEUE_PLACES = SLOTS * 2  # queue_depth 2
PROMPT = "Tell me a long story about a lighthouse keeper and a storm."


class Finished:
    """Records what the engine reports for every request that ran in a slot, and what the
    SDK reports for every chat, queued-only ones included."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []
        self.chats: list[ChatRecord] = []

    @hookimpl
    def kronk_request_finished(self, record: RequestRecord) -> None:
        self.records.append(record)

    @hookimpl
    def kronk_chat_finished(self, record: ChatRecord) -> None:
        self.chats.append(record)


@dataclass
class Server:
    base_url: str
    kronk: Kronk
    finished: Finished
    engine: Engine = field(init=False)

    def __post_init__(self) -> None:
        loaded = self.kronk.get_loaded(MODEL)
        assert loaded is not None
        self.engine = loaded.engine


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, gemma_path: str, serve: Serve
) -> Iterator[Server]:
    settings = {
        **GEMMA_MODEL_SETTINGS,
        "model_path": gemma_path,
        "cache": "none",
        "context_window": 1024,
        "n_seq_max": SLOTS,
        "queue_depth": 2,
    }
    finished = Finished()
    kronk = Kronk(
        KronkConfig(
            base_path=tmp_path_factory.mktemp("disconnects"),
            models={MODEL: ModelConfig.model_validate(settings)},
            queue_wait_seconds=2.0,
        ),
        plugins={"finished": finished},
    )
    kronk.load(MODEL)
    with serve(create_app(ServerSettings(), kronk=kronk)) as base_url:
        yield Server(base_url, kronk, finished)


# Each dialect's route and body for a long answer to PROMPT.
DIALECTS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 400},
    ),
    "responses": ("/v1/responses", {"input": PROMPT, "max_output_tokens": 400}),
    "messages": (
        "/v1/messages",
        {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 400},
    ),
}


def request_body(dialect: str, stream: bool, **overrides: Any) -> tuple[str, dict[str, Any]]:
    path, body = DIALECTS[dialect]
    return path, {**body, "model": MODEL, "temperature": 0, "stream": stream, **overrides}


@dataclass
class Client:
    """One HTTP client with one request in flight; `leave()` drops the connection."""

    task: asyncio.Task[httpx.Response | bytes]
    http: httpx.AsyncClient

    async def leave(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.http.aclose()


def send(server: Server, path: str, body: dict[str, Any]) -> Client:
    http = httpx.AsyncClient(base_url=server.base_url, timeout=120)

    async def run() -> httpx.Response | bytes:
        if not body["stream"]:
            return await http.post(path, json=body)
        async with http.stream("POST", path, json=body) as response:
            return b"".join([chunk async for chunk in response.aiter_raw()])

    return Client(asyncio.ensure_future(run()), http)


def generating(engine: Engine, slots: int, tokens: int = 0) -> Callable[[StepRecord], bool]:
    """A gate condition: the step decoded a generated token for `slots` slots, and the
    engine has generated at least `tokens` more tokens than when this was called."""
    start = engine.stats().generated_tokens

    def condition(record: StepRecord) -> bool:
        enough = engine.stats().generated_tokens - start >= tokens
        return len(record.generating) == slots and enough

    return condition


async def test_dead_queued_clients_free_their_places_at_once(server: Server) -> None:
    engine = server.engine
    await wait_idle(engine)
    seen, ran = len(server.finished.chats), len(server.finished.records)
    holders: list[Client] = []
    queued: list[Client] = []
    with gated(engine, generating(engine, SLOTS)) as gate:
        try:
            for _ in range(SLOTS):  # both slots generate, then the engine stops
                holders.append(send(server, *request_body("chat", True)))
            await gate.wait_held()
            for index in range(QUEUE_PLACES):  # every queue place, streaming or not
                path, body = request_body(("chat", "messages")[index % 2], index % 2 == 0)
                queued.append(send(server, path, body))
            await wait_until(lambda: engine.stats().queued == QUEUE_PLACES)
            # The clients go away while the engine cannot take anything from its queue.
            await asyncio.gather(*(client.leave() for client in queued))
            await wait_until(lambda: engine.stats().queued == 0)
            assert engine.stats().active == SLOTS
            # Every place is free again: a full queue's worth of new requests waits, none
            # gets a 429, although no slot has freed.
            again = [send(server, *request_body("chat", False, max_tokens=2)) for _ in queued]
            await wait_until(lambda: engine.stats().queued == QUEUE_PLACES)
            assert not any(client.task.done() for client in again)
            await asyncio.gather(*(client.leave() for client in holders))
            gate.release()
            answers = await asyncio.gather(*(client.task for client in again))
        finally:
            for client in [*holders, *queued]:
                await client.leave()
    for answer in answers:
        assert isinstance(answer, httpx.Response) and answer.status_code == 200, answer
    await wait_idle(engine)
    await wait_until(lambda: len(server.finished.chats) - seen == 2 * QUEUE_PLACES + SLOTS)
    chats = Counter(record.finish_reason for record in server.finished.chats[seen:])
    assert chats == {"cancelled": QUEUE_PLACES + SLOTS, "length": QUEUE_PLACES}
    # The dead ones ended in the queue: the engine never ran them.
    ran_in_slots = Counter(record.finish_reason for record in server.finished.records[ran:])
    assert ran_in_slots == {"cancelled": SLOTS, "length": QUEUE_PLACES}


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("dialect", list(DIALECTS))
async def test_a_client_gone_stops_its_generation_within_one_step(
    server: Server, dialect: str, stream: bool
) -> None:
    engine = server.engine
    await wait_idle(engine)
    before = engine.stats()
    seen = len(server.finished.records)
    later: list[StepRecord] = []
    # Held once the request has generated a few tokens (a stream has started).
    with gated(engine, generating(engine, 1, tokens=4)) as gate:
        client = send(server, *request_body(dialect, stream))
        try:
            held = await gate.wait_held()
            engine.add_step_listener(later.append)
            await client.leave()
            # The server saw the client go and cancelled the request; the engine is still held.
            await wait_until(lambda: cancelling(engine) == 1)
            assert engine.stats().steps == held.steps
        finally:
            gate.release()
            await client.leave()
    await wait_idle(engine)
    engine.remove_step_listener(later.append)
    (record,) = server.finished.records[seen:]
    assert record.finish_reason == "cancelled"
    # Not one step more: the engine reaped it before its next decode.
    assert record.completion_tokens == held.generated_tokens - before.generated_tokens >= 4
    assert engine.stats().generated_tokens == held.generated_tokens
    assert not later
    assert not any(slot.busy or slot.tokens for slot in engine.slots)
