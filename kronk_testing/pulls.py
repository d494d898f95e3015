"""Model pulls in tests: a catalog file whose `tiny-chat` is the tiny chat model (served from
TINY_PATH of a kronk_testing.file_server.FileServer given to the catalog plugin as its
`hf_endpoint`), a file's sha256 as catalogs give it, and the files a pull left behind."""

from __future__ import annotations

import hashlib
from pathlib import Path

# `size` and `sha` are the served file's; `tiny-missing` is an entry whose file no server has.
TINY_CATALOG = """\
catalog: Tests
models:
  - id: tiny-chat
    category: Text-Generation
    owned_by: kronk
    files:
      models:
        - url: kronk/tiny-GGUF/tiny-llama.gguf
          size: {size}
          sha256: "{sha}"
    capabilities:
      endpoint: chat_completion
    metadata:
      description: A tiny random-weight chat model.
    config:
      context-window: 128
      nseq-max: 2
      sampling-parameters:
        temperature: 0
  - id: tiny-missing
    category: Embedding
    files:
      models:
        - url: kronk/tiny-GGUF/missing.gguf
"""
# Where a pull of `tiny-chat` asks the Hub for its file.
TINY_PATH = "/kronk/tiny-GGUF/resolve/main/tiny-llama.gguf"


def sha256(path: Path) -> str:
    """The file's SHA-256, in hex (read a megabyte at a time)."""
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while block := source.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def write_catalog(base: Path, model: Path, name: str = "tests.yaml") -> None:
    """TINY_CATALOG for the file `model` (the `tiny_llama_path` fixture's), as the catalog
    `name` under the base path."""
    folder = base / "catalogs"
    folder.mkdir(parents=True, exist_ok=True)
    text = TINY_CATALOG.format(size=model.stat().st_size, sha=sha256(model))
    (folder / name).write_text(text, encoding="utf-8")


def leftovers(base: Path) -> list[str]:
    """Files under <base>/models: partial downloads, lock files and models alike."""
    root = base / "models"
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())
