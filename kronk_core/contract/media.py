"""Images and sounds in chat requests: what they are, their limits, and their identity.

A dialect or the SDK turns each image or sound into a `Media` (its bytes, checked against
the configured limits) and puts `MEDIA_MARKER` into the message's text where it goes;
the chat template renders the marker like any text, and the backend cuts the prompt
there and reads the media through the model's projector.

In the engine's token record a media chunk's positions hold pseudo-tokens derived from
a hash of the item's bytes (`media_tokens`): negative, so never a vocabulary id, and
different for every item. Caches compare token records, so a conversation that resends
the same image matches its cells while a changed image (same size, same text around it)
diverges at its first position; a URL or a position never enters the identity.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import re
import secrets
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kronk_core.contract.errors import MediaError, MediaLimitError
from kronk_core.contract.sound import read_sound_header

# Where a media item goes in a message's text. Random per process: a client cannot write
# it, so text that looks like a marker stays text.
MEDIA_MARKER = f"<__kronk_media_{secrets.token_hex(8)}__>"


class MediaKind(StrEnum):
    """What a model's projector reads: images (vision) or sound (audio)."""

    image = "image"
    audio = "audio"

    @property
    def capability(self) -> str:
        return "vision" if self is MediaKind.image else "audio"


# Magic bytes → (kind, media type): the formats llama.cpp's mtmd decodes (stb_image,
# miniaudio). WebP is not among them.
_SIGNATURES: tuple[tuple[bytes, int, MediaKind, str], ...] = (
    (b"\xff\xd8\xff", 0, MediaKind.image, "image/jpeg"),
    (b"\x89PNG\r\n\x1a\n", 0, MediaKind.image, "image/png"),
    (b"GIF87a", 0, MediaKind.image, "image/gif"),
    (b"GIF89a", 0, MediaKind.image, "image/gif"),
    (b"BM", 0, MediaKind.image, "image/bmp"),
    (b"WAVE", 8, MediaKind.audio, "audio/wav"),
    (b"fLaC", 0, MediaKind.audio, "audio/flac"),
    (b"ID3", 0, MediaKind.audio, "audio/mpeg"),
)


def sniff(data: bytes) -> tuple[MediaKind, str] | None:
    """The kind and media type the bytes start like, if any format Kronk reads."""
    for magic, offset, kind, media_type in _SIGNATURES:
        if data[offset : offset + len(magic)] == magic:
            if media_type == "audio/wav" and not data.startswith(b"RIFF"):
                continue
            return kind, media_type
    # An MP3 without an ID3 tag starts with a frame header: 11 sync bits, MPEG audio.
    if len(data) >= 2 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0 and data[1] & 0x06:
        return MediaKind.audio, "audio/mpeg"
    return None


class MediaConfig(BaseModel):
    """Limits on the media in one request, and whether http(s) URLs are fetched."""

    model_config = ConfigDict(extra="forbid")

    # Bytes of one image or sound, as sent (before decoding).
    max_bytes: Annotated[int, Field(ge=1)] = 20 << 20
    # Images and sounds in one request, all messages together.
    max_items: Annotated[int, Field(ge=1)] = 16
    # Width x height of one image.
    max_pixels: Annotated[int, Field(ge=1)] = 50_000_000
    # Seconds of one sound, as its header declares them (decoding reads no more).
    max_audio_seconds: Annotated[float, Field(gt=0.0)] = 600.0
    # http(s) image URLs are fetched only when the operator allows it (kronk_core.media_fetch).
    fetch_urls: bool = False
    # Seconds for all of a request's fetches together: every URL, redirect and read.
    fetch_timeout: Annotated[float, Field(gt=0.0)] = 10.0
    # Hosts a fetch may reach although their addresses are not public (loopback, private,
    # link-local, ...): names as URLs spell them, addresses, or networks (10.0.0.0/8).
    fetch_allow_hosts: list[str] = Field(default_factory=list)

    @field_validator("fetch_allow_hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        return [allowed_host(host) for host in hosts]


def allowed_host(entry: str) -> str:
    """An entry of fetch_allow_hosts: a network or address as written, a host name in its
    ASCII form, lowercase; ValueError for anything else (a URL, a host with a port)."""
    text = entry.strip()
    try:
        ipaddress.ip_network(text, strict=False)
        return text
    except ValueError:
        pass
    try:
        name = text.encode("idna").decode("ascii").lower().rstrip(".")
    except UnicodeError:
        name = ""
    if not _HOST_NAME.fullmatch(name):
        raise ValueError(
            f"{entry!r} is not a host name, an IP address or a network (such as 10.0.0.0/8)"
        )
    return name


_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")


@dataclass(frozen=True, slots=True)
class Media:
    """One image or sound: its bytes and what they are."""

    kind: MediaKind
    data: bytes = field(repr=False)
    media_type: str
    digest: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "digest", hashlib.sha256(self.data).digest())

    @classmethod
    def from_bytes(cls, data: bytes, media_type: str | None = None, *, where: str = "") -> Media:
        """An image or sound from its bytes; the bytes tell what they are, else `media_type`."""
        found = sniff(data)
        declared = _kind_of(media_type)
        if found is not None and declared not in (None, found[0]):
            raise MediaError(
                f"{where or 'media'}: sent as {media_type} but holds {found[1]}",
                param=where or None,
            )
        if found is not None:
            return cls(found[0], data, found[1])
        kind = declared
        if kind is None:
            raise MediaError(
                f"{where or 'media'}: not an image or sound Kronk can read "
                "(JPEG, PNG, GIF, BMP; WAV, MP3, FLAC)",
                param=where or None,
            )
        return cls(kind, data, media_type or "")

    @classmethod
    def from_path(cls, path: str | Path, media_type: str | None = None) -> Media:
        """An image or sound file."""
        file = Path(path).expanduser()
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise MediaError(f"cannot read {file}: {exc.strerror or exc}") from None
        return cls.from_bytes(data, media_type, where=str(file))


def _kind_of(media_type: str | None) -> MediaKind | None:
    if not media_type:
        return None
    major = media_type.split("/", 1)[0].strip().lower()
    return {"image": MediaKind.image, "audio": MediaKind.audio}.get(major)


_DATA_URL = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?:;[^,;]*)*;base64,", re.ASCII)


def from_base64(text: str, media_type: str | None = None, *, where: str, limit: int) -> Media:
    """Media from base64 text (a data URL's or a bare one); MediaError if it is not."""
    if len(text) * 3 // 4 > limit + 3:
        raise MediaLimitError(f"{where}: larger than media max_bytes ({limit} bytes)", param=where)
    try:
        data = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise MediaError(f"{where}: the data is not valid base64", param=where) from None
    return Media.from_bytes(data, media_type, where=where)


def from_data_url(url: str, *, where: str, limit: int) -> Media | None:
    """Media from a `data:TYPE;base64,...` URL; None if `url` is not a data URL."""
    if not url.startswith("data:"):
        return None
    found = _DATA_URL.match(url)
    if found is None:
        raise MediaError(f"{where}: a data URL must be base64 (data:TYPE;base64,...)", param=where)
    return from_base64(url[found.end() :], found["type"], where=where, limit=limit)


_BASE64_TEXT = re.compile(r"^[A-Za-z0-9+/]{16,}={0,2}$", re.ASCII)


def bare_base64(text: str, *, where: str, limit: int) -> Media | None:
    """A message whose whole text is base64 of an image or sound (the manual's plain base64
    form, found by its magic bytes); None for any other text."""
    stripped = text.strip()
    if len(stripped) % 4 or not _BASE64_TEXT.match(stripped):
        return None
    head = base64.b64decode(stripped[:64])
    if sniff(head) is None:
        return None
    return from_base64(stripped, where=where, limit=limit)


def image_size(data: bytes) -> tuple[int, int] | None:
    """Width and height from an image's header, before anything decodes it."""
    try:
        if data.startswith(b"\x89PNG") and data[12:16] == b"IHDR":
            width, height = struct.unpack(">II", data[16:24])
            return width, height
        if data.startswith((b"GIF87a", b"GIF89a")):
            width, height = struct.unpack("<HH", data[6:10])
            return width, height
        if data.startswith(b"BM"):
            width, height = struct.unpack("<ii", data[18:26])
            return abs(width), abs(height)
        if data.startswith(b"\xff\xd8"):
            return _jpeg_size(data)
    except struct.error:
        return None
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """The frame size of the first SOF marker."""
    index = 2
    while index + 9 < len(data):
        if data[index] != 0xFF:
            return None
        marker = data[index + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            index += 2
            continue
        (length,) = struct.unpack(">H", data[index + 2 : index + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", data[index + 5 : index + 9])
            return width, height
        index += 2 + length
    return None


def check_media(items: Sequence[Media], limits: MediaConfig) -> None:
    """The request's media against the limits; the error names the limit it passes."""
    if len(items) > limits.max_items:
        raise MediaLimitError(
            f"{len(items)} images and sounds in one request; media max_items is {limits.max_items}",
            param="messages",
        )
    for number, item in enumerate(items, start=1):
        if len(item.data) > limits.max_bytes:
            raise MediaLimitError(
                f"media item {number} has {len(item.data)} bytes; media max_bytes is "
                f"{limits.max_bytes}",
                param="messages",
            )
        if item.kind is MediaKind.audio:
            _check_sound(item, number, limits)
            continue
        size = image_size(item.data)
        if size is None:
            raise MediaError(
                f"media item {number} ({item.media_type}) is not a readable image",
                param="messages",
            )
        if size[0] * size[1] > limits.max_pixels:
            raise MediaLimitError(
                f"media item {number} is {size[0]}x{size[1]} pixels; media max_pixels is "
                f"{limits.max_pixels}",
                param="messages",
            )


# Sample rates and channels a sound may declare: telephone speech to studio masters.
SAMPLE_RATES = range(8_000, 384_001)
MAX_CHANNELS = 8


def _check_sound(item: Media, number: int, limits: MediaConfig) -> None:
    """A sound's header against the limits, before anything decodes or resamples it."""
    header = read_sound_header(item.data, where=f"media item {number}")
    if header.sample_rate not in SAMPLE_RATES or header.channels > MAX_CHANNELS:
        raise MediaLimitError(
            f"media item {number} declares {header.channels} channels at "
            f"{header.sample_rate} Hz; sounds of 1 to {MAX_CHANNELS} channels at "
            f"{SAMPLE_RATES.start} to {SAMPLE_RATES.stop - 1} Hz are read",
            param="messages",
        )
    if header.frames == 0:
        raise MediaError(f"media item {number} holds no sound", param="messages")
    if header.seconds > limits.max_audio_seconds:
        raise MediaLimitError(
            f"media item {number} is {header.seconds:.1f} seconds of sound; media "
            f"max_audio_seconds is {limits.max_audio_seconds:g}",
            param="messages",
        )


def media_tokens(item: Media, ordinal: int, count: int) -> list[int]:
    """Pseudo-tokens for the `ordinal`-th chunk of an item (a long sound has several).

    Each position takes one of eight 31-bit words of a hash of the item's bytes and the
    chunk's ordinal, as a negative number: two items differ at their first position
    unless 31 bits collide, and then at the next (see `MediaSpan.cut_point`).
    """
    words = hashlib.blake2b(item.digest + ordinal.to_bytes(4, "little"), digest_size=32).digest()
    values = [
        -1 - (int.from_bytes(words[i : i + 4], "little") & 0x7FFFFFFF) for i in range(0, 32, 4)
    ]
    return [values[position % 8] for position in range(count)]


@dataclass(frozen=True, slots=True)
class MediaSpan:
    """One media chunk's positions in a prompt: `length` tokens from `start`.

    `chunk` is the backend's handle (what it encodes); `whole`: its tokens must be
    decoded in one call (non-causal attention over the image).
    """

    start: int
    length: int
    kind: MediaKind
    chunk: object = field(repr=False, compare=False)
    whole: bool = False

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(frozen=True, slots=True)
class MediaPrompt:
    """A prompt's tokens, media positions as pseudo-tokens, and where its media chunks are."""

    tokens: tuple[int, ...]
    spans: tuple[MediaSpan, ...] = ()


def cut_point(spans: Sequence[MediaSpan], length: int) -> int:
    """The longest prefix of at most `length` tokens that ends outside every media chunk:
    the KV of part of an image is never kept."""
    for span in spans:
        if span.start < length < span.end:
            return span.start
    return length


@dataclass(frozen=True, slots=True)
class MediaSources:
    """What a dialect needs to turn what a request sends into Media: the limits, and the
    http(s) URLs already fetched (`fetch_urls`), by URL."""

    limits: MediaConfig = field(default_factory=MediaConfig)
    fetched: Mapping[str, Media] = field(default_factory=dict)

    def base64(self, text: str, media_type: str | None, *, where: str) -> Media:
        return from_base64(text, media_type, where=where, limit=self.limits.max_bytes)

    def url(self, url: str, *, where: str) -> Media:
        """A data URL's media, or a fetched http(s) URL's."""
        inline = from_data_url(url, where=where, limit=self.limits.max_bytes)
        if inline is not None:
            return inline
        if url in self.fetched:
            return self.fetched[url]
        if is_remote(url):
            raise MediaError(
                f"{where}: this server does not fetch image URLs (media fetch_urls is off); "
                "send the image as a data URL",
                param=where,
            )
        raise MediaError(f"{where}: expected a data: or http(s) URL", param=where)


def is_remote(url: str) -> bool:
    return url.startswith(("http://", "https://"))
