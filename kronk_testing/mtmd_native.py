"""llama.cpp's multimodal library (mtmd) called directly, without Kronk: the tests of the
tiny generated projectors check that llama.cpp itself loads, reads and evaluates them."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import mtmd_cpp as mtmd

TEXT_CHUNK, IMAGE_CHUNK, AUDIO_CHUNK = 0, 1, 2


@dataclass
class Native:
    model: llama_cpp.llama_model_p
    context: llama_cpp.llama_context_p
    mtmd: mtmd.mtmd_context_p
    n_vocab: int
    name: str  # the projector's file name


@contextmanager
def open_native(model_path: Path, projector: Path) -> Iterator[Native]:
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


def media_chunks(native: Native, media: list[bytes]) -> list[tuple[int, int, object]]:
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


def last_logits(native: Native, media: list[bytes]) -> np.ndarray:
    """Evaluate the chunks in sequence 0 and return the last position's logits."""
    position = llama_cpp.llama_pos(0)
    memory = llama_cpp.llama_get_memory(native.context)
    llama_cpp.llama_memory_seq_rm(memory, 0, 0, -1)
    chunks = media_chunks(native, media)
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
