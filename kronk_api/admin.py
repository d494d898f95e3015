"""Operator endpoints under /v1/kronk/."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from litestar import Request, get

from kronk_api.endpoints import ADMIN, ENDPOINT_OPT
from kronk_core import Kronk


@get("/v1/kronk/slots", opt={ENDPOINT_OPT: ADMIN})
async def slots(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Per loaded model: its cache strategy's counters and each slot's cache state."""
    kronk: Kronk = request.app.state.kronk
    return {
        "object": "list",
        "data": [
            {
                "model": loaded.id,
                "cache": loaded.config.cache_strategy,
                "counters": asdict(loaded.engine.cache_counters()),
                "slots": [asdict(state) for state in loaded.engine.slot_states()],
            }
            for loaded in kronk.loaded_models()
        ],
    }
