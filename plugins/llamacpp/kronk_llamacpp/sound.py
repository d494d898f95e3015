"""Sounds into the mono samples a projector reads, bounded by what their header declares.

miniaudio decodes (WAV, FLAC, MP3, as llama.cpp's own helper does) and resamples to
the projector's rate in pieces; decoding stops one second past the duration the
header declared (`kronk_core.contract.sound`, checked against the limits before), so no
file can make it allocate more than its header admitted to.
"""

from __future__ import annotations

import math

import miniaudio
import numpy as np

from kronk_core.contract import Media, MediaError, read_sound_header

# Frames decoded per call.
_PIECE = 16_384


def decode_sound(item: Media, rate: int, *, where: str) -> np.ndarray:
    """`item`'s sound as float32 mono samples at `rate` Hz."""
    header = read_sound_header(item.data, where=where)
    most = math.ceil(header.seconds * rate) + rate
    pieces: list[np.ndarray] = []
    count = 0
    try:
        stream = miniaudio.stream_memory(
            item.data,
            output_format=miniaudio.SampleFormat.FLOAT32,
            nchannels=1,
            sample_rate=rate,
            frames_to_read=_PIECE,
        )
        for piece in stream:
            count += len(piece)
            if count > most:
                stream.close()
                raise MediaError(
                    f"{where} holds more sound than its header declares "
                    f"({header.seconds:.1f} seconds)",
                    param="messages",
                )
            pieces.append(np.frombuffer(piece, dtype=np.float32))
    except miniaudio.MiniaudioError as exc:
        raise MediaError(f"{where} could not be decoded: {exc}", param="messages") from None
    if not count:
        raise MediaError(f"{where} holds no sound", param="messages")
    return np.concatenate(pieces)
