"""What a sound file's header declares, read before anything decodes or resamples it.

A sound's size in bytes says little about what decoding it costs: 1 MB of 8-bit
samples declared at 1 Hz is a million seconds, which a resampler to 16 kHz turns
into 64 GB. So every sound is measured from its header first (sample rate,
channels, bit depth, frames) and `check_media` bounds its duration; the backend
then decodes no more than the header declared.

WAV (PCM, float, A-law, mu-law), FLAC and MP3 (MPEG-1, 2 and 2.5, layers I-III)
are read: the formats llama.cpp's audio decoder takes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kronk_core.contract.errors import MediaError

# WAV format codes read: PCM, IEEE float, A-law, mu-law; EXTENSIBLE names one of them.
_WAV_PCM, _WAV_FLOAT, _WAV_ALAW, _WAV_MULAW, _WAV_EXTENSIBLE = 1, 3, 6, 7, 0xFFFE
_WAV_BITS = {_WAV_PCM: (8, 16, 24, 32), _WAV_FLOAT: (32, 64), _WAV_ALAW: (8,), _WAV_MULAW: (8,)}


@dataclass(frozen=True, slots=True)
class SoundHeader:
    """A sound as its header declares it."""

    media_type: str
    sample_rate: int
    channels: int
    # Bits per sample as stored (0 where the format has none: MP3).
    bits: int
    # Sample frames (one sample per channel each) the file holds.
    frames: int

    @property
    def seconds(self) -> float:
        return self.frames / self.sample_rate


def read_sound_header(data: bytes, *, where: str = "media") -> SoundHeader:
    """The header of a WAV, FLAC or MP3 file; MediaError if it cannot be read."""
    if data.startswith(b"RIFF") and data[8:12] == b"WAVE":
        header = _wav(data, where)
    elif data.startswith(b"fLaC"):
        header = _flac(data, where)
    else:
        header = _mp3(data, where)
    if header.sample_rate <= 0 or header.channels <= 0:
        raise MediaError(f"{where}: the sound's header declares no sample rate or channels")
    return header


def _bad(where: str, what: str) -> MediaError:
    return MediaError(f"{where}: not a sound Kronk can read ({what})", param="messages")


def _wav(data: bytes, where: str) -> SoundHeader:
    """RIFF chunks: `fmt ` for the encoding, `data` for the samples (its declared size, or
    what the file holds where that is less)."""
    offset, fmt = 12, None
    while offset + 8 <= len(data):
        chunk, size = data[offset : offset + 4], struct.unpack_from("<I", data, offset + 4)[0]
        body = offset + 8
        if chunk == b"fmt ":
            if size < 16 or body + size > len(data):
                raise _bad(where, "a WAV whose fmt chunk is cut short")
            fmt = data[body : body + size]
        elif chunk == b"data":
            if fmt is None:
                raise _bad(where, "a WAV whose data comes before its fmt chunk")
            return _wav_header(fmt, min(size, len(data) - body), where)
        offset = body + size + (size & 1)  # chunks are padded to an even length
    raise _bad(where, "a WAV without fmt and data chunks")


def _wav_header(fmt: bytes, data_bytes: int, where: str) -> SoundHeader:
    code, channels, rate, _, block, bits = struct.unpack_from("<HHIIHH", fmt)
    if code == _WAV_EXTENSIBLE and len(fmt) >= 26:
        code = struct.unpack_from("<H", fmt, 24)[0]  # the sub-format GUID's first two bytes
    if code not in _WAV_BITS:
        raise _bad(where, f"WAV encoding {code:#x}; PCM, float, A-law and mu-law are read")
    if bits not in _WAV_BITS[code] or channels == 0 or block != channels * bits // 8:
        what = f"a WAV of {channels} channels at {bits} bits in blocks of {block} bytes"
        raise _bad(where, what)
    return SoundHeader("audio/wav", rate, channels, bits, data_bytes // block)


def _flac(data: bytes, where: str) -> SoundHeader:
    """STREAMINFO, the first metadata block: rate, channels, bits and total samples."""
    if len(data) < 8 + 34 or data[4] & 0x7F != 0:
        raise _bad(where, "a FLAC without its STREAMINFO block")
    info = int.from_bytes(data[18:26], "big")  # after min/max block and frame sizes
    rate = info >> 44
    channels = ((info >> 41) & 0x7) + 1
    bits = ((info >> 36) & 0x1F) + 1
    frames = info & ((1 << 36) - 1)
    if frames == 0:
        raise _bad(where, "a FLAC whose header does not declare its length")
    return SoundHeader("audio/flac", rate, channels, bits, frames)


# MPEG audio: bit rates in kbit/s by (version is 1, layer) and index; sample rates by
# version and index; samples per frame by (version is 1, layer).
_BITRATES = {
    (True, 1): (0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (True, 2): (0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 3): (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 1): (0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (False, 2): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    (False, 3): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_SAMPLE_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}
_SAMPLES = {
    (True, 1): 384,
    (True, 2): 1152,
    (True, 3): 1152,
    (False, 1): 384,
    (False, 2): 1152,
    (False, 3): 576,
}


@dataclass(frozen=True, slots=True)
class _Frame:
    length: int
    samples: int
    rate: int
    channels: int
    mpeg1: bool
    side_info: int  # bytes of layer III side information after the header


def _frame(data: bytes, offset: int) -> _Frame | None:
    """The MPEG audio frame whose header is at `offset`, if a valid one is."""
    if offset + 4 > len(data):
        return None
    word = int.from_bytes(data[offset : offset + 4], "big")
    version, layer_bits = (word >> 19) & 0x3, (word >> 17) & 0x3
    bitrate_index, rate_index = (word >> 12) & 0xF, (word >> 10) & 0x3
    if word >> 21 != 0x7FF or version == 1 or layer_bits == 0:
        return None
    if bitrate_index in (0, 15) or rate_index == 3:  # free format, or invalid
        return None
    mpeg1, layer = version == 3, 4 - layer_bits
    bitrate = _BITRATES[(mpeg1, layer)][bitrate_index] * 1000
    rate = _SAMPLE_RATES[version][rate_index]
    padding = (word >> 9) & 0x1
    samples = _SAMPLES[(mpeg1, layer)]
    if layer == 1:
        length = (12 * bitrate // rate + padding) * 4
    else:
        length = samples // 8 * bitrate // rate + padding
    mono = (word >> 6) & 0x3 == 3
    side_info = (17 if mono else 32) if mpeg1 else (9 if mono else 17)
    return _Frame(length, samples, rate, 1 if mono else 2, mpeg1, side_info)


def _mp3(data: bytes, where: str) -> SoundHeader:
    """The frames, walked from the first one: each header gives the next one's place. A
    Xing or Info frame's count stands where it declares more."""
    start = 0
    if data.startswith(b"ID3") and len(data) >= 10:
        size = sum((byte & 0x7F) << (7 * (3 - index)) for index, byte in enumerate(data[6:10]))
        start = 10 + size + (10 if data[5] & 0x10 else 0)
    first = _frame(data, start)
    if first is None:
        raise _bad(where, "no MPEG audio frame where the sound should start")
    frames, offset = 0, start
    frame: _Frame | None = first
    while frame is not None and frame.rate == first.rate and frame.length > 0:
        frames += 1
        offset += frame.length
        frame = _frame(data, offset)
    declared = _xing_frames(data, start, first)
    return SoundHeader(
        "audio/mpeg", first.rate, first.channels, 0, max(frames, declared) * first.samples
    )


def _xing_frames(data: bytes, start: int, first: _Frame) -> int:
    """Frames a Xing or Info tag in the first frame declares (0 where there is none)."""
    tag = start + 4 + first.side_info
    if data[tag : tag + 4] not in (b"Xing", b"Info") or tag + 12 > len(data):
        return 0
    flags = int.from_bytes(data[tag + 4 : tag + 8], "big")
    return int.from_bytes(data[tag + 8 : tag + 12], "big") if flags & 0x1 else 0
