"""Sound headers read before anything decodes: what each format declares, and the limits
`check_media` puts on it (the core alone: no model, no decoder)."""

from __future__ import annotations

import io
import wave

import pytest

from kronk_core.contract.errors import MediaError, MediaLimitError
from kronk_core.contract.media import Media, MediaConfig, MediaKind, check_media
from kronk_core.contract.sound import read_sound_header
from kronk_testing.media_samples import flac, mp3_silence, mp3_with_xing, raw_wav, wav


def sound(data: bytes) -> Media:
    return Media(MediaKind.audio, data, "audio/wav")


def test_a_wav_declares_rate_channels_bits_and_frames() -> None:
    header = read_sound_header(wav(440, seconds=0.5, rate=16000))
    assert (header.media_type, header.sample_rate, header.channels, header.bits) == (
        "audio/wav", 16000, 1, 16,
    )  # fmt: skip
    assert header.frames == 8000
    assert header.seconds == pytest.approx(0.5)


def test_a_wav_that_declares_more_data_than_it_holds_is_measured_by_what_it_holds() -> None:
    header = read_sound_header(raw_wav(bytes(16000), rate=16000, declared=2**32 - 1))
    assert header.frames == 16000


def test_a_stereo_wav_counts_frames_not_samples() -> None:
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(2)
        writer.setsampwidth(2)
        writer.setframerate(8000)
        writer.writeframes(bytes(4 * 8000))
    header = read_sound_header(out.getvalue())
    assert (header.channels, header.frames) == (2, 8000)


def test_flac_and_mp3_headers() -> None:
    header = read_sound_header(flac(rate=44100, channels=2, bits=16, total=441000))
    assert (header.sample_rate, header.channels, header.bits, header.frames) == (
        44100, 2, 16, 441000,
    )  # fmt: skip
    clip = read_sound_header(mp3_silence(40))
    assert (clip.sample_rate, clip.channels, clip.frames) == (44100, 1, 40 * 1152)
    # A Xing tag declaring more frames than the file holds is believed: the decoder would.
    tagged = read_sound_header(mp3_with_xing(10, 2**32 - 1))
    assert tagged.frames == (2**32 - 1) * 1152


@pytest.mark.parametrize(
    ("data", "words"),
    [
        # The probe's sound: a million 8-bit samples at 1 Hz, a million seconds.
        (raw_wav(bytes(1_000_000), rate=1), ("1 Hz", "8000 to 384000 Hz")),
        (raw_wav(bytes(1000), rate=8000, channels=9, bits=8), ("9 channels",)),
        (raw_wav(bytes(8000 * 601), rate=8000), ("601.0 seconds", "max_audio_seconds is 600")),
        (flac(rate=16000, channels=1, bits=16, total=2**36 - 1), ("max_audio_seconds",)),
        (mp3_with_xing(10, 2**32 - 1), ("max_audio_seconds",)),
    ],
)
def test_a_sound_past_a_limit_is_refused_from_its_header(data: bytes, words: tuple[str]) -> None:
    with pytest.raises(MediaLimitError) as caught:
        check_media([sound(data)], MediaConfig())
    assert caught.value.status == 400 and caught.value.code == "media_limit_exceeded"
    for word in words:
        assert word in caught.value.message


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (raw_wav(b"", rate=16000), ("holds no sound",)),
        (raw_wav(bytes(100), rate=16000, code=2), ("WAV encoding 0x2",)),
        (raw_wav(bytes(100), rate=16000, bits=12), ("12 bits",)),
        (b"RIFF\x00\x00\x00\x00WAVEdata\x10\x00\x00\x00" + bytes(16), ("before its fmt",)),
        (flac(rate=16000, channels=1, bits=16, total=0), ("does not declare its length",)),
        (b"fLaC\x01" + bytes(40), ("STREAMINFO",)),
        (b"ID3\x03\x00\x00\x00\x00\x00\x00" + b"no frames here", ("no MPEG audio frame",)),
    ],
)
def test_a_sound_whose_header_cannot_be_read_is_refused(data: bytes, words: tuple[str]) -> None:
    with pytest.raises(MediaError) as caught:
        check_media([sound(data)], MediaConfig())
    assert caught.value.status == 400
    for word in words:
        assert word in caught.value.message


def test_max_audio_seconds_is_a_setting() -> None:
    ten_seconds = raw_wav(bytes(80_000), rate=8000)
    check_media([sound(ten_seconds)], MediaConfig(max_audio_seconds=10))
    with pytest.raises(MediaLimitError, match=r"max_audio_seconds is 9\.5"):
        check_media([sound(ten_seconds)], MediaConfig(max_audio_seconds=9.5))
