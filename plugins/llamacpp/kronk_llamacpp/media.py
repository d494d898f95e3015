"""A text model with a vision or audio projector: llama.cpp's multimodal library (mtmd).

mtmd reads images (stb_image: JPEG, PNG, GIF, BMP) and sounds (miniaudio: WAV, MP3, FLAC),
cuts a prompt into text and media chunks, and runs the projector over a media chunk into
embeddings of the text model's width; those are decoded into a sequence like tokens.
"""

from __future__ import annotations

import ctypes
import logging
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import llama_cpp
import numpy as np

from kronk_core.contract import (
    Batch,
    KronkError,
    Media,
    MediaError,
    MediaKind,
    MediaPrompt,
    MediaSpan,
    ModelConfig,
    ModelLoadError,
    media_tokens,
)
from kronk_llamacpp import native
from kronk_llamacpp.library import route_log
from kronk_llamacpp.model import LlamaTextModel, decode_error, while_open
from kronk_llamacpp.params import FLASH_ATTENTION
from kronk_llamacpp.settings import SETTINGS
from kronk_llamacpp.sound import decode_sound

try:
    from llama_cpp import mtmd_cpp as mtmd
except OSError as exc:  # a build of llama.cpp without its tools
    raise ModelLoadError(
        f"llama.cpp's multimodal library (libmtmd) is not in {native.load().directory}: "
        "a model with a projector needs a build that has it (the llama-cpp-python wheel does)"
    ) from exc

log = logging.getLogger(__name__)

_TEXT_CHUNK, _IMAGE_CHUNK, _AUDIO_CHUNK = 0, 1, 2

mtmd.mtmd_log_set(route_log, ctypes.c_void_p(0))
mtmd.mtmd_helper_log_set(route_log, ctypes.c_void_p(0))


class _Chunk:
    """A media chunk of a tokenized prompt, owned until its request is gone."""

    def __init__(self, pointer: int) -> None:
        self.pointer = pointer

    def __del__(self) -> None:
        if self.pointer:
            mtmd.mtmd_input_chunk_free(self.pointer)
            self.pointer = 0


@dataclass(frozen=True, slots=True)
class _Embeddings:
    rows: np.ndarray  # (tokens, n_embd) float32
    whole: bool
    chunk: _Chunk  # where M-RoPE positions come from
    positions: int  # the KV positions the chunk takes (M-RoPE: fewer than its tokens)


class _Placed(NamedTuple):
    """A media chunk in a sequence under M-RoPE: `length` tokens from token `start`,
    taking `positions` KV positions."""

    start: int
    length: int
    positions: int

    @property
    def end(self) -> int:
        return self.start + self.length


# How a state of a sequence with M-RoPE media begins: its media chunks' places, which the
# KV cells alone do not give back (see LlamaMediaModel.seq_state).
_PLACES_MAGIC = b"KMRP"
_PLACE = struct.Struct("<qqq")


class LlamaMediaModel(LlamaTextModel):
    """Implements kronk_core.contract.backend.MediaModel: a LlamaTextModel plus its projector."""

    def __init__(self, config: ModelConfig, weights: llama_cpp.llama_model_p | None = None) -> None:
        self._mtmd: int | None = None
        self._media_batch: llama_cpp.llama_batch | None = None
        super().__init__(config, weights)
        try:
            self._open_projector(config)
        except BaseException:
            self.close()
            raise

    def _open_projector(self, config: ModelConfig) -> None:
        assert config.projector_path is not None and self._ctx is not None
        llama = SETTINGS.of(config)
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = llama.n_gpu_layers != -1
        params.print_timings = False
        params.n_threads = llama.n_threads or os.cpu_count() or 1
        params.flash_attn_type = FLASH_ATTENTION[llama.flash_attention]
        path = config.projector_path
        self._mtmd = mtmd.mtmd_init_from_file(str(path).encode(), self._model, params)
        if not self._mtmd:
            raise ModelLoadError(
                f"models.{config.id}.projector_path: llama.cpp could not load the projector "
                f"{path} for {config.id} (not an mmproj file, or one made for another model: "
                "its embedding width must be the model's; see the server log)"
            )
        # M-RoPE (the Qwen2-VL family): an image's tokens share one temporal position and
        # take max(rows, columns) positions, so positions run behind token indices after
        # an image. The engine and caches count tokens; each sequence's media places
        # (`_places`) turn its indices into positions here, and only here.
        self._mrope = bool(mtmd.mtmd_decode_use_mrope(self._mtmd))
        self._places: dict[int, list[_Placed]] = {}
        kinds = set()
        if mtmd.mtmd_support_vision(self._mtmd):
            kinds.add(MediaKind.image)
        if mtmd.mtmd_support_audio(self._mtmd):
            kinds.add(MediaKind.audio)
        self._n_embd_inp = int(llama_cpp.llama_model_n_embd_inp(self._model))
        self._n_ubatch = int(llama_cpp.llama_n_ubatch(self._ctx))
        self._media_batch = llama_cpp.llama_batch_init(self._n_batch, self._n_embd_inp, 1)
        # An embedding row under M-RoPE has 4 positions (section-major): the batch points
        # to a buffer of them (its own, which llama_batch_free frees, is put back in close).
        self._media_positions = np.zeros(4 * self._n_batch, dtype=np.int32)
        self._batch_positions = int(ctypes.cast(self._media_batch.pos, ctypes.c_void_p).value or 0)
        if self._mrope:
            self._media_batch.pos = self._media_positions.ctypes.data_as(
                ctypes.POINTER(ctypes.c_int32)
            )
        self.info = replace(
            self.info,
            media=frozenset(kinds),
            projector=str(path),
            memory_bytes=self.info.memory_bytes + path.stat().st_size,
        )

    # ---- MediaModel ---------------------------------------------------------

    @while_open
    def tokenize_media(self, parts: Sequence[str | Media]) -> MediaPrompt:
        items = [part for part in parts if isinstance(part, Media)]
        bitmaps: list[int] = []
        keep: list[object] = []
        pieces = []
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            for part in parts:
                if isinstance(part, str):
                    data = part.encode()
                    text = mtmd.mtmd_input_text(data, len(data), False, True)
                    keep += [data, text]
                    pieces.append(mtmd.mtmd_input_part(ctypes.pointer(text), None))
                    continue
                number = len(bitmaps) + 1
                bitmap = self._bitmap(part, number)
                bitmaps.append(bitmap)
                # The chunk id names the item the chunk belongs to (a long sound has several).
                mtmd.mtmd_bitmap_set_id(bitmap, str(number - 1).encode())
                pieces.append(mtmd.mtmd_input_part(None, bitmap))
            array = (ctypes.POINTER(mtmd.mtmd_input_part) * len(pieces))(
                *(ctypes.pointer(piece) for piece in pieces)
            )
            status = mtmd.mtmd_tokenize_from_parts(self._mtmd, chunks, array, len(pieces), False)
            if status != 0:
                raise MediaError(
                    f"the projector of {self.info.id} could not read the request's images or "
                    f"sounds (mtmd_tokenize status {status})",
                    param="messages",
                )
            return self._prompt(chunks, items)
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)

    def _bitmap(self, item: Media, number: int) -> int:
        if item.kind is MediaKind.audio:
            return self._sound(item, number)
        buffer = (ctypes.c_uint8 * len(item.data)).from_buffer_copy(item.data)
        bitmap: int = mtmd.mtmd_helper_bitmap_init_from_buf(
            self._mtmd, buffer, len(item.data), False
        )
        if not bitmap:
            raise MediaError(
                f"media item {number} ({item.media_type or item.kind.value}) could not be decoded",
                param="messages",
            )
        if mtmd.mtmd_bitmap_is_audio(bitmap):
            mtmd.mtmd_bitmap_free(bitmap)
            raise MediaError(
                f"media item {number} is declared an image but holds a sound", param="messages"
            )
        return bitmap

    def _sound(self, item: Media, number: int) -> int:
        """A sound as mono samples at the projector's rate, decoded here rather than by
        mtmd's helper, which sizes its buffer by what the file claims and cannot fail
        without ending the process."""
        rate = int(mtmd.mtmd_get_audio_sample_rate(self._mtmd))
        samples = decode_sound(item, rate, where=f"media item {number}")
        bitmap: int = mtmd.mtmd_bitmap_init_from_audio(
            len(samples), samples.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        )
        if not bitmap:
            raise MediaError(f"media item {number} could not be decoded", param="messages")
        return bitmap

    def _prompt(self, chunks: int, items: list[Media]) -> MediaPrompt:
        tokens: list[int] = []
        spans: list[MediaSpan] = []
        seen: dict[int, int] = {}
        for index in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, index)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            if kind == _TEXT_CHUNK:
                count = ctypes.c_size_t()
                pointer = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                tokens.extend(pointer[: count.value])
                continue
            item = int(mtmd.mtmd_input_chunk_get_id(chunk) or b"0")
            ordinal = seen[item] = seen.get(item, -1) + 1
            length = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
            span = MediaSpan(
                start=len(tokens),
                length=length,
                kind=MediaKind.image if kind == _IMAGE_CHUNK else MediaKind.audio,
                chunk=_Chunk(mtmd.mtmd_input_chunk_copy(chunk)),
                whole=bool(mtmd.mtmd_decode_use_non_causal(self._mtmd, chunk)),
            )
            spans.append(span)
            tokens.extend(media_tokens(items[item], ordinal, length))
        return MediaPrompt(tuple(tokens), tuple(spans))

    @while_open
    def encode_media(self, span: MediaSpan) -> object:
        chunk = span.chunk
        assert isinstance(chunk, _Chunk)
        if self._compute(mtmd.mtmd_encode_chunk, self._mtmd, chunk.pointer) != 0:
            raise KronkError(f"the projector of {self.info.id} failed to encode a media chunk")
        pointer = mtmd.mtmd_get_output_embd(self._mtmd)
        rows = np.ctypeslib.as_array(pointer, shape=(span.length * self._n_embd_inp,))
        return _Embeddings(
            rows.reshape(span.length, self._n_embd_inp).copy(),
            span.whole,
            chunk,
            int(mtmd.mtmd_input_chunk_get_n_pos(chunk.pointer)),
        )

    @while_open
    def decode_media(
        self, embeddings: object, offset: int, count: int, position: int, seq_id: int
    ) -> None:
        assert isinstance(embeddings, _Embeddings) and self._media_batch is not None
        limit = min(self._n_batch, self._n_ubatch) if embeddings.whole else self._n_batch
        if count > limit:
            raise KronkError(
                f"a media chunk of {count} tokens is decoded in one batch (attention over it "
                f"is not causal): {self.info.id} needs n_batch and llamacpp.n_ubatch of at "
                f"least {count}"
            )
        batch = self._media_batch
        width = self._n_embd_inp
        rows = np.ctypeslib.as_array(batch.embd, shape=(self._n_batch * width,))
        rows[: count * width] = embeddings.rows[offset : offset + count].reshape(-1)
        if self._mrope:
            self._mrope_positions(embeddings, offset, count, position, seq_id)
        else:
            np.ctypeslib.as_array(batch.pos, shape=(count,))[:] = np.arange(
                position, position + count
            )
        np.ctypeslib.as_array(batch.n_seq_id, shape=(count,))[:] = 1
        np.ctypeslib.as_array(batch.logits, shape=(count,))[:] = 0
        for index in range(count):
            batch.seq_id[index][0] = seq_id
        batch.n_tokens = count
        self.check_workers()
        if embeddings.whole:
            llama_cpp.llama_set_causal_attn(self._ctx, False)
        try:
            status = self._compute(llama_cpp.llama_decode, self._ctx, batch)
        finally:
            if embeddings.whole:
                llama_cpp.llama_set_causal_attn(self._ctx, True)
        if status != 0:
            raise decode_error(status)

    # ---- M-RoPE: media places per sequence ----------------------------------

    def _mrope_positions(
        self, embeddings: _Embeddings, offset: int, count: int, index: int, seq_id: int
    ) -> None:
        """Writes the 4 M-RoPE positions of the chunk's rows offset..offset+count, section-major
        as mtmd's helper lays them out (temporal, row, column, unused); the chunk is
        placed in the sequence when its first rows decode."""
        start = index - offset
        places = self._places.setdefault(seq_id, [])
        if offset == 0:
            places[:] = [place for place in places if place.end <= start]
            places.append(_Placed(start, len(embeddings.rows), embeddings.positions))
        first = self._position(seq_id, start)
        image = mtmd.mtmd_input_chunk_get_tokens_image(embeddings.chunk.pointer)
        out = self._media_positions
        if image:
            decoder = (mtmd.mtmd_decoder_pos * len(embeddings.rows))()
            mtmd.mtmd_helper_image_get_decoder_pos(image, first, decoder)
            txyz = np.frombuffer(decoder, dtype=np.uint32).reshape(-1, 4)[offset : offset + count]
            for section, column in enumerate((0, 2, 1, 3)):  # t, y, x, z
                out[section * count : (section + 1) * count] = txyz[:, column]
        else:  # sound: one position per token, in every section
            for section in range(4):
                out[section * count : (section + 1) * count] = np.arange(
                    first + offset, first + offset + count
                )

    def _position(self, seq_id: int, index: int) -> int:
        places = self._places.get(seq_id)
        if index < 0 or not places:
            return index
        behind = 0  # how far positions run behind indices after the chunks passed
        for place in places:
            if index < place.start:
                break
            if index < place.end:
                return place.start - behind  # every token of a chunk starts at its first
            behind += place.length - place.positions
        return index - behind

    def _index(self, seq_id: int, position: int) -> int:
        """The token index at which the sequence's `position` starts (_position's inverse)."""
        behind = 0
        for place in self._places.get(seq_id, ()):
            if position < place.start - behind + place.positions:
                break
            behind += place.length - place.positions
        return position + behind

    def _cut(self, seq_id: int, index: int) -> None:
        """The sequence keeps its tokens before `index`: the chunks it holds whole."""
        places = self._places.get(seq_id)
        if places:
            places[:] = [place for place in places if place.end <= index]

    @while_open
    def decode(self, batch: Batch) -> None:
        if self._mrope and any(self._places.get(seq_id) for seq_id in set(batch.seq_ids)):
            positions = [
                self._position(seq_id, index)
                for index, seq_id in zip(batch.positions, batch.seq_ids, strict=True)
            ]
            batch = Batch(batch.tokens, positions, batch.seq_ids, batch.logits)
        super().decode(batch)

    @while_open
    def seq_remove(self, seq_id: int, start: int, end: int) -> bool:
        places = self._places.get(seq_id)
        if places and end >= 0 and any(place.end > start for place in places):
            # Positions after the gap would not move with the indices: refused, as a cache
            # that cannot cut there (context shift is off with media).
            return False
        removed = super().seq_remove(seq_id, start, end)
        if removed and end < 0:
            self._cut(seq_id, start)
        return removed

    @while_open
    def seq_copy(self, src: int, dst: int, start: int, end: int) -> None:
        if self._mrope:
            self._places[dst] = list(self._places.get(src, ()))
        super().seq_copy(src, dst, start, end)
        if end >= 0:
            self._cut(dst, end)

    @while_open
    def trim_floor(self, seq_id: int) -> int:
        return self._index(seq_id, super().trim_floor(seq_id))

    @while_open
    def seq_state(self, seq_id: int) -> bytes:
        return self._with_places(seq_id, super().seq_state(seq_id))

    @while_open
    def set_seq_state(self, seq_id: int, state: bytes) -> int:
        return super().set_seq_state(seq_id, self._take_places(seq_id, state))

    @while_open
    def checkpoint(self, seq_id: int) -> bytes:
        return self._with_places(seq_id, super().checkpoint(seq_id))

    @while_open
    def restore_checkpoint(self, seq_id: int, length: int, state: bytes) -> bool:
        return super().restore_checkpoint(seq_id, length, self._take_places(seq_id, state))

    def _with_places(self, seq_id: int, state: bytes) -> bytes:
        """A saved sequence carries its media places: the cells hold positions, and which
        tokens took them is not in them."""
        if not self._mrope:
            return state
        places = self._places.get(seq_id, [])
        header = _PLACES_MAGIC + struct.pack("<I", len(places))
        return header + b"".join(_PLACE.pack(*place) for place in places) + state

    def _take_places(self, seq_id: int, state: bytes) -> bytes:
        if not self._mrope:
            return state
        if not state.startswith(_PLACES_MAGIC):
            raise KronkError(f"a saved sequence of {self.info.id} lacks its media places")
        (count,) = struct.unpack_from("<I", state, len(_PLACES_MAGIC))
        at = len(_PLACES_MAGIC) + 4
        self._places[seq_id] = [
            _Placed(*_PLACE.unpack_from(state, at + index * _PLACE.size)) for index in range(count)
        ]
        return state[at + count * _PLACE.size :]

    def close(self) -> None:
        if self._media_batch is not None:
            self._media_batch.pos = ctypes.cast(
                self._batch_positions, ctypes.POINTER(llama_cpp.llama_pos)
            )
            llama_cpp.llama_batch_free(self._media_batch)
            self._media_batch = None
        if self._mtmd:
            mtmd.mtmd_free(self._mtmd)
            self._mtmd = None
        super().close()
