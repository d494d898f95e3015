"""The tiny Qwen2.5-VL generator (kronk_testing.models.qwen_vl): llama.cpp's own mtmd loads
its projector, places an image's tokens with M-RoPE (nx x ny tokens taking max(nx, ny)
positions), encodes images into embeddings the `qwen2vl` text model decodes, and different
images give different logits; Kronk loads it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from llama_cpp import mtmd_cpp as mtmd

from kronk_core import Kronk, KronkConfig
from kronk_core.contract.media import MediaKind
from kronk_core.settings.config import ModelConfig
from kronk_testing.media_samples import image, striped
from kronk_testing.models.qwen_vl import QWEN_VL_PROJECTOR, make_tiny_qwen_vl
from kronk_testing.mtmd_native import (
    IMAGE_CHUNK,
    TEXT_CHUNK,
    last_logits,
    media_chunks,
    open_native,
)

# Generated afresh, to test the generator itself: seconds on 2 cores, so the full tier.
pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_qwen_vl(tmp_path_factory.mktemp("tiny-qwen-vl") / "tiny-qwen-vl.gguf")


def test_the_projector_places_images_with_m_rope(made: Path) -> None:
    with open_native(made, made.parent / QWEN_VL_PROJECTOR) as native:
        assert mtmd.mtmd_support_vision(native.mtmd)
        assert not mtmd.mtmd_support_audio(native.mtmd)
        assert mtmd.mtmd_decode_use_mrope(native.mtmd)


@pytest.mark.parametrize(
    ("size", "grid"),
    [((224, 112), (8, 4)), ((112, 224), (4, 8)), ((64, 48), (4, 3)), ((640, 480), (23, 17))],
)
def test_an_image_is_a_grid_of_tokens_taking_its_longer_side_in_positions(
    made: Path, size: tuple[int, int], grid: tuple[int, int]
) -> None:
    """Images are resized to multiples of 28 pixels, one token per 28 x 28 (at least 8
    tokens): the text after an image goes on max(nx, ny) positions later."""
    with open_native(made, made.parent / QWEN_VL_PROJECTOR) as native:
        chunks = media_chunks(native, [image((10, 200, 30), size)])
        try:
            assert [kind for kind, _, _ in chunks] == [TEXT_CHUNK, IMAGE_CHUNK, TEXT_CHUNK]
            _, count, chunk = chunks[1]
            tokens = mtmd.mtmd_input_chunk_get_tokens_image(chunk)
            nx, ny = mtmd.mtmd_image_tokens_get_nx(tokens), mtmd.mtmd_image_tokens_get_ny(tokens)
            assert (nx, ny) == grid
            assert count == nx * ny
            assert mtmd.mtmd_input_chunk_get_n_pos(chunk) == max(grid)
            assert not mtmd.mtmd_decode_use_non_causal(native.mtmd, chunk)
        finally:
            for _, _, copy in chunks:
                mtmd.mtmd_input_chunk_free(copy)


def test_images_evaluate_and_differ(made: Path) -> None:
    with open_native(made, made.parent / QWEN_VL_PROJECTOR) as native:
        first = last_logits(native, [striped((224, 112))])
        assert np.all(np.isfinite(first))
        assert np.array_equal(first, last_logits(native, [striped((224, 112))]))
        assert not np.allclose(first, last_logits(native, [striped((224, 112), shift=2)]))
        # The same pixels in another shape are other positions: other logits.
        assert not np.allclose(first, last_logits(native, [striped((112, 224))]))


def test_kronk_loads_it_for_images(made: Path, tmp_path: Path) -> None:
    """Where its answers land is proven against llama.cpp's own path
    (plugins/llamacpp/tests/test_media_reference.py) and through the caches
    (plugins/caching/tests/test_media_caching.py)."""
    model = ModelConfig(model_path=made, projector_path=made.parent / QWEN_VL_PROJECTOR)
    with Kronk(KronkConfig(base_path=tmp_path, models={"qwen-vl": model})) as kronk:
        info = kronk.load("qwen-vl").model.info
        assert info.architecture == "qwen2vl"
        assert info.media == {MediaKind.image}
