"""The tiny multimodal generator: llama.cpp's mtmd loads its projectors, reads images and
sounds into media chunks, encodes them, and their embeddings decode into the text model."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
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

# These generate their models afresh, to test the generators themselves (every other test
# takes the cached ones): tens of seconds on 2 cores, so the full tier.
pytestmark = pytest.mark.model

TEXT_CHUNK, IMAGE_CHUNK, AUDIO_CHUNK = 0, 1, 2


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Made afresh (not the cached ones), so the generator itself is tested."""
    return make_tiny_multimodal(tmp_path_factory.mktemp("tiny-mm") / "tiny-mm-llama.gguf")


@dataclass
class Native:
    model: llama_cpp.llama_model_p
    context: llama_cpp.llama_context_p
    mtmd: mtmd.mtmd_context_p
    n_vocab: int
    name: str  # the projector's file name


@contextmanager
def _native(model_path: Path, projector: Path) -> Iterator[Native]:
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(
        str(model_path).encode(), llama_cpp.llama_model_default_params()
    )
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = 2048, 512, 512
    context = llama_cpp.llama_init_from_model(model, params)
    options = mtmd.mtmd_context_params_default()
    options.use_gpu, options.print_timings, options.warmup = False, False, False
    handle = mtmd.mtmd_init_from_file(str(projector).encode(), model, options)
    assert handle, f"mtmd refused {projector.name}"
    vocab = llama_cpp.llama_model_get_vocab(model)
    try:
        yield Native(model, context, handle, llama_cpp.llama_vocab_n_tokens(vocab), projector.name)
    finally:
        mtmd.mtmd_free(handle)
        llama_cpp.llama_free(context)
        llama_cpp.llama_model_free(model)


@pytest.fixture(scope="module", params=[VISION_PROJECTOR, AUDIO_PROJECTOR, BOTH_PROJECTOR])
def native(made: Path, request: pytest.FixtureRequest) -> Iterator[Native]:
    with _native(made, made.parent / request.param) as opened:
        yield opened


def _chunks(native: Native, media: list[bytes]) -> list[tuple[int, int, object]]:
    """Tokenize "text, item, text, item, ... text" into (type, tokens, chunk copy) triples."""
    texts = ["<start_of_turn>user\nLook: ", *([" and "] * (len(media) - 1)), " now?\n"]
    keep: list[object] = []
    bitmaps = []
    parts = []
    for index, text in enumerate(texts):
        data = text.encode()
        piece = mtmd.mtmd_input_text(data, len(data), False, True)
        keep += [piece, data]
        parts.append(mtmd.mtmd_input_part(ctypes.pointer(piece), None))
        if index < len(media):
            buffer = (ctypes.c_uint8 * len(media[index])).from_buffer_copy(media[index])
            bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(
                native.mtmd, buffer, len(media[index]), False
            )
            assert bitmap, "the media did not decode"
            bitmaps.append(bitmap)
            parts.append(mtmd.mtmd_input_part(None, bitmap))
    array = (ctypes.POINTER(mtmd.mtmd_input_part) * len(parts))(
        *(ctypes.pointer(part) for part in parts)
    )
    chunks = mtmd.mtmd_input_chunks_init()
    try:
        assert mtmd.mtmd_tokenize_from_parts(native.mtmd, chunks, array, len(parts), True) == 0
        found = []
        for index in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, index)
            found.append(
                (
                    mtmd.mtmd_input_chunk_get_type(chunk),
                    mtmd.mtmd_input_chunk_get_n_tokens(chunk),
                    mtmd.mtmd_input_chunk_copy(chunk),
                )
            )
    finally:
        mtmd.mtmd_input_chunks_free(chunks)
        for bitmap in bitmaps:
            mtmd.mtmd_bitmap_free(bitmap)
    return found


def _last_logits(native: Native, media: list[bytes]) -> np.ndarray:
    """Evaluate the chunks in sequence 0 and return the last position's logits."""
    position = llama_cpp.llama_pos(0)
    memory = llama_cpp.llama_get_memory(native.context)
    llama_cpp.llama_memory_seq_rm(memory, 0, 0, -1)
    chunks = _chunks(native, media)
    for index, (_, _, chunk) in enumerate(chunks):
        last = index == len(chunks) - 1
        status = mtmd.mtmd_helper_eval_chunk_single(
            native.mtmd,
            native.context,
            chunk,
            position.value,
            0,
            512,
            last,
            ctypes.byref(position),
        )
        mtmd.mtmd_input_chunk_free(chunk)
        assert status == 0
    pointer = llama_cpp.llama_get_logits_ith(native.context, -1)
    return np.ctypeslib.as_array(pointer, shape=(native.n_vocab,)).copy()


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
    found = _chunks(native, media)
    for _, _, chunk in found:
        mtmd.mtmd_input_chunk_free(chunk)
    return [(kind, count) for kind, count, _ in found]


def test_projectors_report_what_they_take(native: Native) -> None:
    supports = (mtmd.mtmd_support_vision(native.mtmd), mtmd.mtmd_support_audio(native.mtmd))
    assert supports == EXPECTED[native.name]
    assert not mtmd.mtmd_decode_use_mrope(native.mtmd)


def test_an_image_is_one_chunk_of_fixed_size(made: Path) -> None:
    with _native(made, made.parent / VISION_PROJECTOR) as opened:
        for size in ((64, 48), (640, 480), (20, 300)):
            kinds = _kinds(opened, [image((10, 200, 30), size)])
            assert kinds[1] == (IMAGE_CHUNK, image_tokens())
            assert [kind for kind, _ in kinds] == [TEXT_CHUNK, IMAGE_CHUNK, TEXT_CHUNK]


def test_sound_is_one_chunk_per_30_seconds(made: Path) -> None:
    with _native(made, made.parent / AUDIO_PROJECTOR) as opened:
        assert _kinds(opened, [wav(440, 40.0)])[1:3] == [(AUDIO_CHUNK, 150), (AUDIO_CHUNK, 150)]
        assert _kinds(opened, [mp3_silence()])[1] == (AUDIO_CHUNK, 150)


def test_media_evaluate_and_differ(native: Native) -> None:
    first, second = SAMPLES[native.name]
    same = _last_logits(native, first)
    assert np.array_equal(same, _last_logits(native, first))
    assert not np.allclose(same, _last_logits(native, second))
