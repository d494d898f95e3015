"""Media for multimodal tests, made in memory: images (Pillow, the `test` extra), WAV
(the standard library's `wave`) and MP3 clips. Pillow is imported by the functions that
draw."""

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
