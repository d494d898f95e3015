"""GGUF model files: the id a file is served under, split parts, and projectors beside it."""

from __future__ import annotations

import re
from pathlib import Path

from kronk_core.contract import ModelFile

# A model split into parts: llama.cpp loads it from its first part and finds the others.
SPLIT_PART = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})$")
# Vision and audio projectors (llama.cpp's mmproj files, `mmproj-F16.gguf` or
# `model-mmproj-f16.gguf`) sit beside their models; not models.
PROJECTOR_MARK = "mmproj"


def is_gguf(path: Path) -> bool:
    return path.suffix.lower() == ".gguf"


def is_projector(path: Path) -> bool:
    return PROJECTOR_MARK in path.name.lower()


def model_file_id(path: Path) -> str | None:
    """The id a GGUF file is served under: its stem; a split model's first part without
    `-00001-of-0000N`; None for the other parts and for projectors."""
    stem = path.stem
    if is_projector(path):
        return None
    split = SPLIT_PART.match(stem)
    if split is None:
        return stem
    return split["stem"] if int(split["part"]) == 1 else None


def model_parts(path: Path) -> list[Path]:
    """A model's files: the file, or every part of a split model named by its first part."""
    split = SPLIT_PART.match(path.stem)
    if split is None:
        return [path]
    count = int(split["count"])
    return [
        path.with_name(f"{split['stem']}-{part:05d}-of-{count:05d}{path.suffix}")
        for part in range(1, count + 1)
    ]


def describe(path: Path) -> ModelFile | None:
    """A GGUF model's first file as a ModelFile; None for anything else."""
    model_id = model_file_id(path) if is_gguf(path) else None
    if model_id is None:
        return None
    projectors = sorted(p for p in path.parent.glob("*") if is_gguf(p) and is_projector(p))
    return ModelFile(
        id=model_id, path=path, parts=tuple(model_parts(path)), projectors=tuple(projectors)
    )
