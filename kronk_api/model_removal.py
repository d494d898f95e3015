"""Deleting a model's files from a running server, as `kronk model rm` does: Kronk's
DELETE /v1/kronk/models/{id} and the Ollama dialect's DELETE /api/delete."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kronk_core import Kronk
from kronk_core.contract.errors import ModelLoadedError
from kronk_core.settings.model_files import delete_model_files, removable_files


async def delete_model_files_of(kronk: Kronk, model_id: str, *, force: bool) -> dict[str, Any]:
    """Delete what `model_id` was installed or pulled as under <base>/models; anything else
    (a packaged model, a file the configuration names, a model folder's) is refused.
    While loaded from these files it is refused (ModelLoadedError) unless `force`, which
    unloads it first."""
    if model_id not in kronk.models.ids():
        raise kronk.models.unknown(model_id)
    sources = kronk.models.sources()
    removed = removable_files(kronk.config, model_id, kronk.models.provided(), sources)
    ours = {path.resolve() for path in removed.parts}
    entries = kronk.pool.entries()
    loaded = [e.model_id for e in entries if Path(e.model.info.path).resolve() in ours]
    if loaded and not force:
        raise ModelLoadedError(
            f"{model_id} is loaded (as {', '.join(loaded)}): unload it first, or pass force=true"
        )
    for loaded_id in loaded:
        await kronk.aunload(loaded_id)
    size = sum(path.stat().st_size for path in removed.parts)
    await asyncio.to_thread(delete_model_files, kronk.config, removed, sources)
    return {
        "id": model_id,
        "deleted": [str(path) for path in removed.parts],
        "size_bytes": size,
        "unloaded": loaded,
    }
