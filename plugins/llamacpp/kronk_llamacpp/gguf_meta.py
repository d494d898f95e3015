"""A GGUF file's metadata, read from its header without llama.cpp (for estimates before a load)."""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from kronk_core.contract import ModelLoadError

_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


class _Cursor:
    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self.at = 0

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.data, self.at)[0]
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.take("<Q")
        text = bytes(self.data[self.at : self.at + size]).decode("utf-8", errors="replace")
        self.at += size
        return text

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, count = self.take("<I"), self.take("<Q")
            if item_kind == _STRING:  # vocabularies: skipped, only their size matters here
                for _ in range(count):
                    self.at += 8 + struct.unpack_from("<Q", self.data, self.at)[0]
                return count
            if item_kind in _SCALARS:
                fmt = _SCALARS[item_kind]
                values = struct.unpack_from(f"<{count}{fmt[1]}", self.data, self.at)
                self.at += count * struct.calcsize(fmt)
                return list(values)
        raise ValueError(f"unknown GGUF value type {kind}")


@dataclass(frozen=True)
class _Header:
    metadata: dict[str, Any]
    parameters: int  # the elements of the tensors this file holds


@lru_cache(maxsize=32)
def _read(path: Path, _size: int, _mtime: float) -> _Header:
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = _Cursor(data)
        if data[:4] != b"GGUF":
            raise ValueError("no GGUF magic")
        cursor.at = 4
        if cursor.take("<I") < 2:
            raise ValueError("GGUF version 1 is not supported")
        tensors = cursor.take("<Q")
        found: dict[str, Any] = {}
        for _ in range(cursor.take("<Q")):
            key = cursor.string()
            found[key] = cursor.value(cursor.take("<I"))
        parameters = 0
        for _ in range(tensors):  # name, dimensions, type, offset
            cursor.string()
            shape = [cursor.take("<Q") for _ in range(cursor.take("<I"))]
            parameters += math.prod(shape)
            cursor.at += 4 + 8
        return _Header(found, parameters)


def _header(path: Path) -> _Header:
    try:
        stat = path.stat()
        return _read(path, stat.st_size, stat.st_mtime)
    except (OSError, ValueError, struct.error) as exc:
        raise ModelLoadError(
            f"model_path: could not load {path}: no valid GGUF header ({exc})"
        ) from None


def read_metadata(path: Path) -> dict[str, Any]:
    """Key/values of the GGUF header; string arrays (the vocabulary) as their length."""
    return _header(path).metadata


def parameter_count(path: Path) -> int:
    """How many weights the file holds (one part's share, for a split model)."""
    return _header(path).parameters
