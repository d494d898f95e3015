"""Hostile sounds against a model with an audio projector: each is refused with a 400 or
answered, and the process lives on. Before sounds were bounded from their header, the
probe's 1 MB WAV at 1 Hz made llama.cpp's resampler ask for 64 GB: `std::bad_alloc`,
which no Python code can catch, ended the process (and this test run with it).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator

import httpx
import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import strategies as st

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_testing.fuzzing import fuzz_settings
from kronk_testing.media_samples import flac, mp3_silence, mp3_with_xing, raw_wav, wav
from kronk_testing.plugin import MultimodalPaths
from kronk_testing.server import Serve


@pytest.fixture(scope="module")
def kronk(multimodal_paths: MultimodalPaths, tmp_path_factory: pytest.TempPathFactory) -> Kronk:
    """The tiny chat model with its audio projector, one slot, nothing cached."""
    settings = {
        "model_path": multimodal_paths.model,
        "projector_path": multimodal_paths.audio,
        "templates": {"template": "gemma"},
        "context_window": 4096,
        "n_seq_max": 1,
        "draft_strategy": "none",
        "cache": "none",
    }
    base = tmp_path_factory.mktemp("kronk-hostile-sounds")
    models = {"audio": ModelConfig.model_validate(settings)}
    return Kronk(KronkConfig(base_path=base, models=models))


@pytest.fixture(scope="module")
def server(kronk: Kronk, serve: Serve) -> Iterator[str]:
    with serve(create_app(ServerSettings(), kronk=kronk)) as url:
        yield url


def post_sound(url: str, data: bytes) -> httpx.Response:
    encoded = base64.b64encode(data).decode()
    part = {"type": "input_audio", "input_audio": {"data": encoded, "format": "wav"}}
    body = {
        "model": "audio",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": [part]}],
    }
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


def test_the_probes_wav_at_1_hz_is_a_400_and_the_server_lives_on(server: str) -> None:
    response = post_sound(server, raw_wav(bytes(1_000_000), rate=1))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "media_limit_exceeded"
    assert "1 Hz" in error["message"]
    assert post_sound(server, wav(440, seconds=0.5)).status_code == 200


def test_a_sound_longer_than_its_header_says_is_not_decoded_past_it(server: str) -> None:
    """Ten frames, junk, then ten thousand more: the header walk stops at the junk (0.26 s),
    miniaudio's MP3 decoder finds the rest (261 s); decoding stops a second past 0.26 s."""
    clip = mp3_silence(10) + bytes(50) + mp3_silence(10_000)
    response = post_sound(server, clip)
    assert response.status_code == 400, response.text
    assert "holds more sound than its header declares" in response.json()["error"]["message"]


# Values at and past the edges of what each field may hold.
RATES = st.sampled_from([0, 1, 7_999, 8_000, 16_000, 44_100, 384_001, 2**31 - 1, 2**32 - 1])
COUNTS = st.sampled_from([0, 1, 2, 1000, 2**31 - 1, 2**32 - 1])


@st.composite
def wav_files(draw: st.DrawFn) -> bytes:
    payload = draw(st.binary(max_size=4000))
    return raw_wav(
        payload,
        rate=draw(RATES),
        channels=draw(st.integers(0, 12)),
        bits=draw(st.sampled_from([0, 1, 8, 12, 16, 24, 32, 64])),
        code=draw(st.sampled_from([1, 2, 3, 6, 7, 0x11, 0xFFFE])),
        declared=draw(st.none() | COUNTS),
    )


@st.composite
def flac_files(draw: st.DrawFn) -> bytes:
    header = flac(
        rate=draw(st.integers(0, 2**20 - 1)),
        channels=draw(st.integers(1, 8)),
        bits=draw(st.integers(1, 32)),
        total=draw(st.integers(0, 2**36 - 1)),
    )
    return header + draw(st.binary(max_size=2000))


@st.composite
def mp3_files(draw: st.DrawFn) -> bytes:
    head = draw(st.integers(0xFFE00000, 0xFFFFFFFF)).to_bytes(4, "big")
    frames = draw(st.integers(1, 40))
    body = mp3_with_xing(frames, draw(COUNTS)) if draw(st.booleans()) else mp3_silence(frames)
    return head + draw(st.binary(max_size=500)) + body


SOUNDS = st.one_of(wav_files(), flac_files(), mp3_files())


@pytest.mark.fuzz
def test_fuzzed_sound_headers_are_refused_or_answered(
    server: str, explore: Callable[[Callable[[], None]], None]
) -> None:
    """WAV, FLAC and MP3 headers with every field at and past its edges, through the whole
    media path (header check, decode, projector): a 400 or an answer, never the process's
    end; a plain sound is answered afterwards."""

    @fuzz_settings(
        "sound headers",
        max_examples=80,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(data=SOUNDS)
    @example(data=raw_wav(bytes(1_000_000), rate=1))
    @example(data=flac(rate=8000, channels=1, bits=8, total=2**36 - 1))
    @example(data=mp3_with_xing(5, 2**32 - 1))
    def send(data: bytes) -> None:
        response = post_sound(server, data)
        assert response.status_code in (200, 400), response.text
        assert "Traceback" not in response.text

    explore(send)
    assert post_sound(server, wav(440, seconds=0.5)).status_code == 200
