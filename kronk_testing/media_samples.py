"""Media for multimodal tests, made in memory: images (Pillow, the `test` extra), WAV
(the standard library's `wave`), MP3 clips, and sound files whose headers say whatever a
test needs. Pillow is imported by the functions that draw."""

from __future__ import annotations

import io
import math
import struct
import wave


def image(color: tuple[int, int, int], size: tuple[int, int] = (64, 48), fmt: str = "PNG") -> bytes:
    """A one-color image; `fmt` is a Pillow format name (PNG, JPEG, GIF, BMP)."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format=fmt)
    return out.getvalue()


def striped(size: tuple[int, int] = (64, 48), shift: int = 0) -> bytes:
    """A PNG of vertical stripes; `shift` moves them (same size, different content)."""
    from PIL import Image

    width, height = size
    picture = Image.new("RGB", size)
    picture.putdata(
        [
            (255, 255, 255) if ((x + shift) // 4) % 2 else (0, 0, 0)
            for y in range(height)
            for x in range(width)
        ]
    )
    out = io.BytesIO()
    picture.save(out, format="PNG")
    return out.getvalue()


def wav(frequency: float, seconds: float = 1.0, rate: int = 16000) -> bytes:
    """A mono 16-bit sine tone."""
    frames = b"".join(
        struct.pack("<h", int(12000 * math.sin(2 * math.pi * frequency * i / rate)))
        for i in range(int(rate * seconds))
    )
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(frames)
    return out.getvalue()


def mp3_silence(frames: int = 40) -> bytes:
    """An MPEG-1 Layer III stream of silent frames (128 kbit/s, 44.1 kHz, mono).

    Each frame is a header and zeroed side information and main data, which a decoder
    reads as silence: no encoder is needed to make a valid MP3.
    """
    header = bytes([0xFF, 0xFB, 0x90, 0xC4])  # sync, MPEG-1 L3, no CRC, 128k, 44.1k, mono
    size = 144 * 128000 // 44100  # 417 bytes per frame, no padding
    return (header + bytes(size - len(header))) * frames


def raw_wav(
    payload: bytes, *, rate: int, channels: int = 1, bits: int = 8, code: int = 1,
    declared: int | None = None,
) -> bytes:  # fmt: skip
    """A WAV whose header says what the arguments say, whatever the payload holds."""
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", code, channels, rate, (rate * block) & 0xFFFFFFFF, block, bits)
    size = len(payload) if declared is None else declared
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", size) + payload
    return b"RIFF" + struct.pack("<I", len(body)) + body


def flac(*, rate: int, channels: int, bits: int, total: int) -> bytes:
    """fLaC and a STREAMINFO block (last), then no frames."""
    info = (rate << 44) | ((channels - 1) << 41) | ((bits - 1) << 36) | total
    block = struct.pack(">HH", 4096, 4096) + bytes(6) + info.to_bytes(8, "big") + bytes(16)
    return b"fLaC" + bytes([0x80]) + len(block).to_bytes(3, "big") + block


def mp3_with_xing(frames: int, declared: int) -> bytes:
    """`frames` silent MPEG-1 Layer III frames (mono), the first carrying a Xing tag that
    declares `declared` frames."""
    clip = bytearray(mp3_silence(frames))
    tag = 4 + 17  # header, then mono MPEG-1 side information
    clip[tag : tag + 12] = b"Xing" + struct.pack(">II", 0x1, declared)
    return bytes(clip)
