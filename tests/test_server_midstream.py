"""Failures and disconnects once a request is running: error events, cancellation."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

import httpx

from kronk_llamacpp.packaged import GEMMA_MODEL_ID

if TYPE_CHECKING:
    from kronk_testing.server import RunningServer


async def test_unload_mid_stream_sends_an_error_event(server: RunningServer) -> None:
    body = {
        "model": GEMMA_MODEL_ID,
        "messages": [{"role": "user", "content": "Tell me a long story about dragons."}],
        "max_tokens": 400,
        "temperature": 0,
        "stream": True,
    }
    events: list[str] = []
    try:
        async with (
            httpx.AsyncClient(base_url=server.base_url, timeout=60) as client,
            client.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line.removeprefix("data: "))
                if len(events) == 3:
                    # The model goes away while this stream is generating.
                    await asyncio.to_thread(server.kronk.unload)
    finally:
        await asyncio.to_thread(server.kronk.load)
    error = json.loads(events[-1])
    assert error["error"]["code"] == "unavailable"
    assert "unloaded" in error["error"]["message"]
    assert all("[DONE]" not in event for event in events)
    assert all("choices" in json.loads(event) for event in events[:-1])


async def test_slots_endpoint_reports_cache_state(server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        response = await client.get("/v1/kronk/slots")
    assert response.status_code == 200
    entries = {entry["model"]: entry for entry in response.json()["data"]}
    entry = entries[GEMMA_MODEL_ID]
    assert entry["cache"] == "none"
    assert set(entry["counters"]) == {
        "hits",
        "partial_hits",
        "rebuilds",
        "evictions",
        "restores",
        "checkpoint_restores",
        "shared_prefixes",
        "tokens_saved",
        "host_bytes",
    }
    assert [slot["id"] for slot in entry["slots"]] == [0, 1, 2, 3]
    speculation = {"accepted_prediction_tokens", "rejected_prediction_tokens", "draft_acceptance"}
    fields = {"id", "cached_tokens", "idle_seconds", "busy", "pending", "adapters"}
    assert all(set(slot) == fields | speculation for slot in entry["slots"])
    assert all(slot["adapters"] == [] for slot in entry["slots"])  # a model without LoRA
    # No draft strategy on this model: nothing drafted, no acceptance rate.
    assert all(
        (slot["accepted_prediction_tokens"], slot["rejected_prediction_tokens"]) == (0, 0)
        and slot["draft_acceptance"] is None
        for slot in entry["slots"]
    )
