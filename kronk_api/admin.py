"""Operator endpoints under /v1/kronk/."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any

from litestar import Request, get, post
from litestar.params import FromPath

from kronk_api.endpoints import ADMIN, ENDPOINT_OPT
from kronk_core import Kronk
from kronk_core.memory import estimate_summary
from kronk_core.models import unknown_model


@get("/v1/kronk/slots", opt={ENDPOINT_OPT: ADMIN})
async def slots(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Per loaded model: its cache strategy's counters and each slot's cache state."""
    kronk: Kronk = request.app.state.kronk
    return {
        "object": "list",
        "data": [
            {
                "model": loaded.id,
                "cache": loaded.config.cache,
                "counters": asdict(loaded.engine.cache_counters()),
                # Steps, queued and active requests, tokens generated and prefilled so far.
                "engine": asdict(loaded.engine.stats()),
                "slots": [asdict(state) for state in loaded.engine.slot_states()],
            }
            for loaded in kronk.loaded_models()
        ],
    }


@get("/v1/kronk/devices", opt={ENDPOINT_OPT: ADMIN})
async def devices(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The backends' devices with their free and total memory (llama.cpp: CPU, CUDA0, ...)."""
    kronk: Kronk = request.app.state.kronk
    found = await asyncio.to_thread(kronk.devices)
    return {"object": "list", "data": [asdict(device) for device in found]}


def _estimates(kronk: Kronk, model_ids: list[str]) -> dict[str, dict[str, object] | None]:
    found = {model_id: kronk.memory_estimate(model_id) for model_id in model_ids}
    return {key: None if value is None else estimate_summary(value) for key, value in found.items()}


@get("/v1/kronk/models")
async def loaded_models(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The model pool: each loaded model with its memory, its estimate, slots, activity, TTL."""
    kronk: Kronk = request.app.state.kronk
    pool = kronk.pool
    entries = pool.entries()
    estimates = await asyncio.to_thread(_estimates, kronk, [e.model_id for e in entries])
    return {
        "object": "list",
        "models_in_cache": pool.capacity,
        "cache_ttl_seconds": pool.ttl,
        "data": [
            {
                "id": entry.model_id,
                "model_path": entry.model.info.path,
                "capabilities": sorted(entry.model.info.capabilities)
                + sorted(kind.capability for kind in entry.model.info.media),
                "memory_bytes": entry.model.info.memory_bytes,
                "memory_estimate": estimates[entry.model_id],
                "slots": entry.model.info.n_seq_max,
                "active_requests": entry.model.active_requests,
                "idle_seconds": round(entry.idle_seconds, 3),
                "loaded_seconds": round(entry.loaded_seconds, 3),
                "ttl_left_seconds": None if entry.ttl_left is None else round(entry.ttl_left, 3),
            }
            for entry in entries
        ],
    }


@post("/v1/kronk/models/{model_id:str}/unload", status_code=200)
async def unload_model(request: Request[Any, Any, Any], model_id: FromPath[str]) -> dict[str, Any]:
    """Unload a model now; requests still running on it end with an error."""
    kronk: Kronk = request.app.state.kronk
    known = kronk.model_ids()
    if model_id not in known:
        raise unknown_model(model_id, known)
    return {"id": model_id, "unloaded": await kronk.aunload(model_id)}


ADMIN_ROUTES = [slots, devices, loaded_models, unload_model]
