"""The tiny multimodal generator: llama.cpp's mtmd loads its projectors, reads images and
sounds into media chunks, encodes them, and their embeddings decode into the text model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from llama_cpp import mtmd_cpp as mtmd

from kronk_testing.media_samples import image, mp3_silence, wav
from kronk_testing.models.multimodal import (
    AUDIO_PROJECTOR,
    BOTH_PROJECTOR,
    VISION_PROJECTOR,
    image_tokens,
    make_tiny_multimodal,
)
from kronk_testing.mtmd_native import (
    AUDIO_CHUNK,
    IMAGE_CHUNK,
    TEXT_CHUNK,
    Native,
    last_logits,
    media_chunks,
    open_native,
)

# These generate their models afresh, to test the generators themselves (every other test
# takes the cached ones): tens of seconds on 2 cores, so the full tier.
pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Made afresh (not the cached ones), so the generator itself is tested."""
    return make_tiny_multimodal(tmp_path_factory.mktemp("tiny-mm") / "tiny-mm-llama.gguf")


@pytest.fixture(scope="module", params=[VISION_PROJECTOR, AUDIO_PROJECTOR, BOTH_PROJECTOR])
def native(made: Path, request: pytest.FixtureRequest) -> Iterator[Native]:
    with open_native(made, made.parent / request.param) as opened:
        yield opened


EXPECTED = {
    VISION_PROJECTOR: (True, False),
    AUDIO_PROJECTOR: (False, True),
    BOTH_PROJECTOR: (True, True),
}
SAMPLES = {
    VISION_PROJECTOR: ([image((255, 0, 0))], [image((0, 0, 255))]),
    AUDIO_PROJECTOR: ([wav(440)], [wav(880)]),
    BOTH_PROJECTOR: ([image((255, 0, 0)), wav(440)], [image((0, 0, 255)), wav(440)]),
}


def _kinds(native: Native, media: list[bytes]) -> list[tuple[int, int]]:
    found = media_chunks(native, media)
    for _, _, chunk in found:
        mtmd.mtmd_input_chunk_free(chunk)
    return [(kind, count) for kind, count, _ in found]


def test_projectors_report_what_they_take(native: Native) -> None:
    supports = (mtmd.mtmd_support_vision(native.mtmd), mtmd.mtmd_support_audio(native.mtmd))
    assert supports == EXPECTED[native.name]
    assert not mtmd.mtmd_decode_use_mrope(native.mtmd)


def test_an_image_is_one_chunk_of_fixed_size(made: Path) -> None:
    with open_native(made, made.parent / VISION_PROJECTOR) as opened:
        for size in ((64, 48), (640, 480), (20, 300)):
            kinds = _kinds(opened, [image((10, 200, 30), size)])
            assert kinds[1] == (IMAGE_CHUNK, image_tokens())
            assert [kind for kind, _ in kinds] == [TEXT_CHUNK, IMAGE_CHUNK, TEXT_CHUNK]


def test_sound_is_one_chunk_per_30_seconds(made: Path) -> None:
    with open_native(made, made.parent / AUDIO_PROJECTOR) as opened:
        assert _kinds(opened, [wav(440, 40.0)])[1:3] == [(AUDIO_CHUNK, 150), (AUDIO_CHUNK, 150)]
        assert _kinds(opened, [mp3_silence()])[1] == (AUDIO_CHUNK, 150)


def test_media_evaluate_and_differ(native: Native) -> None:
    first, second = SAMPLES[native.name]
    same = last_logits(native, first)
    assert np.array_equal(same, last_logits(native, first))
    assert not np.allclose(same, last_logits(native, second))
