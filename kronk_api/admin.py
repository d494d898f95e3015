"""Operator endpoints under /v1/kronk/."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from litestar import Request, delete, get, post
from litestar.params import FromPath, FromQuery

from kronk_api.endpoints import ADMIN, ENDPOINT_OPT
from kronk_api.model_removal import delete_model_files_of
from kronk_core import Kronk
from kronk_core.contract.memory import estimate_summary


@get("/v1/kronk/slots", opt={ENDPOINT_OPT: ADMIN})
async def slots(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Per loaded model: its cache strategy's counters and each slot's cache state."""
    kronk: Kronk = request.app.state.kronk
    return {
        "object": "list",
        "data": [
            {
                "model": loaded.id,
                "cache": loaded.cache.name,
                "counters": asdict(loaded.engine.cache_counters()),
                # Steps, queued and active requests, tokens generated and prefilled so far.
                "engine": asdict(loaded.engine.stats()),
                "slots": [asdict(state) for state in loaded.engine.slot_states()],
            }
            for loaded in kronk.loaded_models()
        ],
    }


# /v1/devices: the Kronk manual's path of the same list.
@get(["/v1/kronk/devices", "/v1/devices"], opt={ENDPOINT_OPT: ADMIN})
async def devices(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The backends' devices with their free and total memory (llama.cpp: CPU, CUDA0, ...)."""
    kronk: Kronk = request.app.state.kronk
    found = await asyncio.to_thread(kronk.models.devices)
    return {"object": "list", "data": [asdict(device) for device in found]}


def _estimates(kronk: Kronk, model_ids: list[str]) -> dict[str, dict[str, object] | None]:
    found = {model_id: kronk.models.memory_estimate(model_id) for model_id in model_ids}
    return {key: None if value is None else estimate_summary(value) for key, value in found.items()}


@get("/v1/kronk/models", opt={ENDPOINT_OPT: ADMIN})
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
    if model_id not in kronk.models.ids():
        raise kronk.models.unknown(model_id)
    return {"id": model_id, "unloaded": await kronk.aunload(model_id)}


@delete("/v1/kronk/models/{model_id:str}", status_code=200)
async def delete_model(
    request: Request[Any, Any, Any], model_id: FromPath[str], force: FromQuery[bool] = False
) -> dict[str, Any]:
    """Delete a model installed or pulled under <base>/models, as `kronk model rm` does, and
    with its refusals. While loaded from these files it is refused (409), unless `force`
    unloads it first."""
    return await delete_model_files_of(request.app.state.kronk, model_id, force=force)


def _iso(seconds_ago: float | None) -> str | None:
    """A time `seconds_ago` before now (negative: ahead), as UTC ISO 8601."""
    if seconds_ago is None:
        return None
    moment = datetime.now(UTC) - timedelta(seconds=seconds_ago)
    return moment.isoformat(timespec="seconds")


@get("/v1/kronk/models/ps", opt={ENDPOINT_OPT: ADMIN})
async def models_ps(request: Request[Any, Any, Any]) -> list[dict[str, Any]]:
    """The Kronk manual's list of loaded models (`kronk model ps`): a bare list, one entry
    per model with its memory, KV cache, slots, streams and when its TTL unloads it."""
    kronk: Kronk = request.app.state.kronk
    entries = kronk.pool.entries()
    estimates = await asyncio.to_thread(_estimates, kronk, [e.model_id for e in entries])
    found = []
    for entry in entries:
        info = entry.model.info
        estimate = estimates[entry.model_id]
        found.append(
            {
                "id": entry.model_id,
                "owned_by": "kronk",
                "model_family": info.architecture,
                "size": sum(part.stat().st_size for part in kronk.models.parts(Path(info.path))),
                "vram_total": info.memory_bytes,
                "kv_cache": estimate["kv_bytes"] if estimate else None,
                "slots": info.n_seq_max,
                "expires_at": None if entry.ttl_left is None else _iso(-entry.ttl_left),
                "active_streams": entry.model.active_requests,
                "status": "loaded",
            }
        )
    return found


@get("/v1/kronk/models/imc-sessions", opt={ENDPOINT_OPT: ADMIN})
async def imc_sessions(request: Request[Any, Any, Any]) -> list[dict[str, Any]]:
    """The Kronk manual's IMC sessions: each slot of each model that caches with IMC, with
    the tokens its conversation keeps and when it last served."""
    kronk: Kronk = request.app.state.kronk
    return [
        {
            "model_id": loaded.id,
            "id": state.id,
            "state": "pending"
            if state.pending
            else "busy"
            if state.busy
            else "cached"
            if state.cached_tokens
            else "empty",
            "context": state.cached_tokens,
            "context_window": loaded.info.n_ctx_per_seq,
            "last_used": _iso(state.idle_seconds) if state.cached_tokens else None,
        }
        for loaded in kronk.loaded_models()
        if loaded.cache.name == "imc"
        for state in loaded.engine.slot_states()
    ]


@get("/v1/pool/budget", opt={ENDPOINT_OPT: ADMIN})
async def pool_budget(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The Kronk manual's memory budget: each device's memory, what the loaded models hold
    there (their estimates' placement), and each model's share (its reservation)."""
    kronk: Kronk = request.app.state.kronk
    entries = kronk.pool.entries()
    found = await asyncio.to_thread(kronk.models.devices)
    estimates = await asyncio.to_thread(_estimates, kronk, [e.model_id for e in entries])
    reservations: list[dict[str, Any]] = []
    for entry in entries:
        summary = estimates[entry.model_id] or {}
        placement = cast(list[dict[str, Any]], summary.get("placement", []))
        per = [{"name": share["device"], "bytes": share["total_bytes"]} for share in placement]
        reservations.append(
            {"key": entry.model_id, "bytes": entry.model.info.memory_bytes, "per": per}
        )
    used: dict[str, int] = {}
    for reservation in reservations:
        for share in reservation["per"]:
            used[share["name"]] = used.get(share["name"], 0) + share["bytes"]
    return {
        "models_in_cache": kronk.pool.capacity,
        "models_loaded": len(entries),
        "devices": [
            {
                "index": device.index,
                "name": device.name,
                "type": device.type,
                "total_bytes": device.memory_total,
                "free_bytes": device.memory_free,
                "used_bytes": used.get(device.name, 0),
            }
            for device in found
        ],
        "reservations": reservations,
    }


ADMIN_ROUTES = [
    slots,
    devices,
    loaded_models,
    unload_model,
    delete_model,
    models_ps,
    imc_sessions,
    pool_budget,
]
