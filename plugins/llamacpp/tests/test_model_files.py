"""GGUF files as models: ids, split parts and projectors, through the hooks the core asks."""

from __future__ import annotations

from pathlib import Path

from kronk_core import Kronk, KronkConfig
from kronk_core.contract import ModelFile
from kronk_core.runtime.loading import model_config_for


def test_split_parts_and_projectors_are_not_models(tmp_path: Path) -> None:
    root = tmp_path / "models" / "org" / "repo"
    root.mkdir(parents=True)
    names = ("big-00001-of-00002.gguf", "big-00002-of-00002.gguf", "mmproj-F16.gguf", "a.gguf")
    for name in (*names, "notes.txt", "a.gguf.partial"):
        (root / name).write_bytes(b"GGUF")
    projector = root / "mmproj-F16.gguf"
    with Kronk(KronkConfig(base_path=tmp_path)) as kronk:
        assert kronk.models.sources().installed == {
            "a": ModelFile("a", root / "a.gguf", (root / "a.gguf",), (projector,)),
            "big": ModelFile(
                "big",
                root / "big-00001-of-00002.gguf",
                (root / "big-00001-of-00002.gguf", root / "big-00002-of-00002.gguf"),
                (projector,),
            ),
        }
        assert kronk.models.parts(root / "big-00001-of-00002.gguf") == (
            root / "big-00001-of-00002.gguf",
            root / "big-00002-of-00002.gguf",
        )
        assert kronk.models.parts(root / "notes.txt") == (root / "notes.txt",)
        # Both models take the one projector beside them.
        resolved = model_config_for(kronk, "big")
        assert (resolved.model_path, resolved.projector_path) == (
            root / "big-00001-of-00002.gguf",
            projector,
        )
