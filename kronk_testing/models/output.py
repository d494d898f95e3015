"""What the test-model scripts share: where models go, writing a GGUF safely, the command line."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import gguf

from kronk_core.contract import cache_dir


def default_out_dir() -> Path:
    return cache_dir() / "test-models"  # $XDG_CACHE_HOME/kronk or ~/.cache/kronk


@contextmanager
def gguf_writer(path: Path, arch: gguf.MODEL_ARCH, name: str) -> Iterator[gguf.GGUFWriter]:
    """A writer for `path`; the file appears only once the block has added everything."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write beside the target and rename, so an interrupted run never leaves a broken cache.
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    writer = gguf.GGUFWriter(partial, gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name(name)
    yield writer
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(path)


def cached(path: Path, make: Callable[[Path], Path]) -> Path:
    """`path`, made on first use."""
    return path if path.is_file() else make(path)


def main(doc: str | None, file_name: str, make: Callable[[Path], Path]) -> None:
    """`python scripts/<script>.py [--out DIR]`: make the model once, print its path."""
    main_all(doc, {file_name: make})


def main_all(doc: str | None, makers: Mapping[str, Callable[[Path], Path]]) -> None:
    """`main` for a script that makes several models: each once, by file name."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=default_out_dir(), help="output directory [%(default)s]"
    )
    args = parser.parse_args()
    for file_name, make in makers.items():
        print(cached(args.out / file_name, make))
