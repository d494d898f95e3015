"""Where a model's projector comes from (its setting in either spelling, beside a pulled
model, the catalog) and where it shows: the memory estimate, `kronk model show`."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from kronk_api.cli import main
from kronk_core import Kronk, KronkConfig, Media
from kronk_core.contract.media import MediaKind
from kronk_core.runtime.loading import model_config_for
from kronk_core.settings.config import parse_model_config
from kronk_testing.media_samples import image
from kronk_testing.plugin import MultimodalPaths

CATALOG = """\
catalog: Tests
models:
  - id: Tiny-VL
    category: Image-Text-to-Text
    template: gemma
    files:
      models:
        - url: kronk/tiny-VL-GGUF/tiny-vl.gguf
      proj:
        url: kronk/tiny-VL-GGUF/mmproj-tiny-vl.gguf
    capabilities:
      endpoint: chat_completion
      images: true
    config:
      context-window: 1024
"""


def test_the_projector_setting_in_both_spellings(tmp_path: Path) -> None:
    ours = parse_model_config("a", {"projector_path": "/p/mmproj.gguf"})
    manual = parse_model_config("a", {"proj-file": "/p/mmproj.gguf"})
    assert ours.projector_path == manual.projector_path == Path("/p/mmproj.gguf")
    assert parse_model_config("a", {"proj-file": ""}).projector_path is None


def _install(base: Path, paths: MultimodalPaths, *projectors: str) -> Path:
    folder = base / "models" / "org" / "vl-GGUF"
    folder.mkdir(parents=True)
    (folder / "vl-Q4_K_M.gguf").symlink_to(paths.model)
    for name in projectors:
        (folder / name).symlink_to(paths.both)
    return folder


@pytest.mark.model
def test_a_pulled_model_reads_through_the_projector_beside_it(
    multimodal_paths: MultimodalPaths, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = _install(tmp_path, multimodal_paths, "mmproj-F16.gguf")
    with Kronk(KronkConfig(base_path=tmp_path)) as kronk:
        assert "vl-Q4_K_M" in kronk.models.ids()
        assert not any(model_id.startswith("mmproj") for model_id in kronk.models.ids())
        assert model_config_for(kronk, "vl-Q4_K_M").projector_path == folder / "mmproj-F16.gguf"
        # Before loading, from the projector's header; after, from the loaded projector.
        assert kronk.models.media("vl-Q4_K_M") == {MediaKind.image, MediaKind.audio}
        estimate = kronk.models.memory_estimate("vl-Q4_K_M")
        assert (
            estimate is not None
            and estimate.projector_bytes == multimodal_paths.both.stat().st_size
        )
        assert estimate.total_bytes == (
            estimate.weights_bytes + estimate.projector_bytes + estimate.kv_bytes
        )
        kronk.load("vl-Q4_K_M")
        assert kronk.models.media("vl-Q4_K_M") == {MediaKind.image, MediaKind.audio}
        assert kronk.models.media(None) == frozenset()  # the default model has no projector
    (folder / "mmproj-Q8_0.gguf").symlink_to(multimodal_paths.vision)
    with caplog.at_level(logging.WARNING), Kronk(KronkConfig(base_path=tmp_path)) as kronk:
        assert model_config_for(kronk, "vl-Q4_K_M").projector_path is None
    assert "2 projectors beside it" in caplog.text


def test_model_show_names_the_projector_and_counts_it(
    multimodal_paths: MultimodalPaths, tmp_path: Path
) -> None:
    _install(tmp_path, multimodal_paths, "mmproj-tiny.gguf")
    result = CliRunner().invoke(main, ["model", "show", "vl-Q4_K_M", "--base-path", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "mmproj-tiny.gguf (reads images and sounds)" in result.output
    assert "+ projector" in result.output


def test_a_catalog_model_runs_with_its_projector(
    multimodal_paths: MultimodalPaths, tmp_path: Path
) -> None:
    (tmp_path / "catalogs").mkdir()
    (tmp_path / "catalogs" / "tests.yaml").write_text(CATALOG, encoding="utf-8")
    folder = tmp_path / "models" / "kronk" / "tiny-VL-GGUF"
    folder.mkdir(parents=True)
    (folder / "tiny-vl.gguf").symlink_to(multimodal_paths.model)
    (folder / "mmproj-tiny-vl.gguf").symlink_to(multimodal_paths.vision)
    with Kronk(KronkConfig(base_path=tmp_path)) as kronk:
        settings = kronk.models.provided()["Tiny-VL"]
        assert settings["projector_path"] == str(folder / "mmproj-tiny-vl.gguf")
        result = asyncio.run(
            kronk.chat(
                [{"role": "user", "content": ["What?", Media.from_bytes(image((9, 99, 199)))]}],
                model="Tiny-VL",
                max_tokens=2,
            )
        )
        assert result.usage.prompt_tokens > 64
        assert kronk.models.media("Tiny-VL") == {MediaKind.image}
