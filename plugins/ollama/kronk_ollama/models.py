"""Models as Ollama describes them: /api/tags, /api/ps and /api/show (plain dicts for JSON).

Each reads GGUF headers and the file system: call them off the event loop.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kronk_core.contract import (
    Capability,
    Kronk,
    KronkError,
    MediaKind,
    ModelFacts,
    model_config_for,
)
from kronk_ollama.schemas import ollama_name

# What /api/ps gives a model that never expires (keep_alive -1, the preloaded model).
NEVER = datetime(9999, 12, 31, tzinfo=UTC)
# llama.cpp's embedding architectures: what /api/show says of a model that is not loaded.
EMBEDDING_ARCHITECTURES = frozenset(
    {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "modern-bert"}
)


@dataclass(frozen=True, slots=True)
class ModelFile:
    """A model's file as far as it can be read; `path` None when it is not on disk yet."""

    model_id: str
    path: Path | None
    size: int
    modified: datetime
    facts: ModelFacts | None

    @property
    def digest(self) -> str:
        """Names the model and this version of its file (path, size, time), not a hash of
        its bytes: hashing gigabytes on every listing would cost minutes. Aliases share it."""
        text = f"{self.model_id}|{self.path}|{self.size}|{self.modified.isoformat()}"
        return hashlib.sha256(text.encode()).hexdigest()

    def details(self) -> dict[str, Any]:
        facts = self.facts
        return {
            "parent_model": "",
            "format": "gguf",
            "family": facts.architecture if facts else "",
            "families": [facts.architecture] if facts else None,
            "parameter_size": parameter_size(facts.parameters) if facts else "",
            "quantization_level": facts.quantization if facts else "",
        }


def parameter_size(count: int) -> str:
    """As Ollama writes it: 134515008 → 134.52M, 8030261248 → 8.03B."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= scale:
            return f"{count / scale:.2f}{suffix}"
    return str(count)


def model_file(kronk: Kronk, model_id: str) -> ModelFile:
    try:
        path = model_config_for(kronk, model_id).model_path
        assert path is not None  # resolved
        stats = [part.stat() for part in kronk.models.parts(path)]
        facts = kronk.models.facts(model_id)
    except (KronkError, OSError):
        # Configured but not on disk yet (pulled on first use): listed without its file.
        return ModelFile(model_id, None, 0, datetime.fromtimestamp(0, UTC), None)
    modified = datetime.fromtimestamp(max(stat.st_mtime for stat in stats), UTC)
    return ModelFile(model_id, path, sum(stat.st_size for stat in stats), modified, facts)


def _entry(name: str, found: ModelFile) -> dict[str, Any]:
    return {
        "name": ollama_name(name),
        "model": ollama_name(name),
        "modified_at": found.modified.isoformat(),
        "size": found.size,
        "digest": found.digest,
        "details": found.details(),
    }


def tags(kronk: Kronk) -> dict[str, Any]:
    """Every model id, then every alias (with its model's file)."""
    names = [*kronk.models.ids(), *kronk.models.aliases()]
    return {
        "models": [_entry(name, model_file(kronk, kronk.models.canonical(name))) for name in names]
    }


def running(kronk: Kronk) -> dict[str, Any]:
    """The loaded models, with their memory and when they unload if left idle."""
    now = datetime.now(UTC)
    models = []
    for entry in kronk.pool.entries():
        info = entry.model.info
        estimate = kronk.models.memory_estimate(entry.model_id)
        on_devices = sum(
            share.weights_bytes + share.kv_bytes
            for share in (estimate.placement if estimate else ())
            if share.device_type != "cpu"
        )
        expires = (
            NEVER
            if entry.ttl_left is None
            else datetime.fromtimestamp(now.timestamp() + entry.ttl_left, UTC)
        )
        models.append(
            {
                **_entry(entry.model_id, model_file(kronk, entry.model_id)),
                "size": info.memory_bytes,
                "size_vram": on_devices,
                "expires_at": expires.isoformat(),
                "context_length": info.n_ctx_per_seq,
            }
        )
    return {"models": models}


def capabilities(kronk: Kronk, model_id: str, facts: ModelFacts | None) -> list[str]:
    """Ollama's capability names: the loaded model's, else what its file suggests."""
    loaded = kronk.pool.get(model_id)
    if loaded is not None:
        has = loaded.info.capabilities
        embedding = Capability.embeddings in has or Capability.rerank in has
    else:
        embedding = facts is not None and facts.architecture in EMBEDDING_ARCHITECTURES
    if embedding:
        return ["embedding"]
    media = kronk.models.media(model_id)
    found = ["completion", "tools"]
    if MediaKind.image in media:
        found.append("vision")
    if MediaKind.audio in media:
        found.append("audio")
    return found


def show(kronk: Kronk, model_id: str) -> dict[str, Any]:
    """What /api/show tells: the file's facts, the settings the config entry gives, the
    chat template once the model is loaded."""
    config = model_config_for(kronk, model_id)
    found = model_file(kronk, model_id)
    facts = found.facts
    settings = config.sampling.model_dump(exclude_none=True)
    parameters = "\n".join(f"{key} {value}" for key, value in settings.items())
    loaded = kronk.pool.get(model_id)
    info: dict[str, Any] = dict(loaded.info.metadata) if loaded is not None else {}
    if facts is not None:
        info.update(
            {
                "general.architecture": facts.architecture,
                "general.parameter_count": facts.parameters,
                f"{facts.architecture}.context_length": facts.context_length,
            }
        )
    return {
        "modelfile": f"# Served by Kronk\nFROM {found.path}\n"
        + "".join(f"PARAMETER {line}\n" for line in parameters.splitlines()),
        "parameters": parameters,
        "template": (loaded.info.chat_template or "") if loaded is not None else "",
        "details": found.details(),
        "model_info": info,
        "capabilities": capabilities(kronk, model_id, facts),
        "modified_at": found.modified.isoformat(),
    }


def clock() -> str:
    """Ollama's created_at: the time, to the microsecond, in UTC."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")
