"""OpenAI's speech to text (/v1/audio/transcriptions and /translations) through the official
`openai` SDK, on the tiny chat model with its generated audio projector: the transcript is
the model's answer to the sound (random weights: its text is compared with the same prompt
run as a chat, not read); every response format; refusals in OpenAI's shape."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import anthropic
import httpx
import ollama
import pytest
from openai import BadRequestError, NotFoundError, OpenAI

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, ModelConfig, Transcription
from kronk_core.contract.media import Media, MediaConfig
from kronk_core.transcription import transcription_request
from kronk_testing.media_samples import image, raw_wav, wav
from kronk_testing.plugin import MultimodalPaths
from kronk_testing.server import Serve

pytestmark = pytest.mark.model

SECONDS = 0.5


@pytest.fixture(scope="module")
def kronk(multimodal_paths: MultimodalPaths, tmp_path_factory: pytest.TempPathFactory) -> Kronk:
    """The tiny model with its audio projector ("audio"), and with its vision one ("vision")."""
    common = {
        "model_path": multimodal_paths.model,
        "templates": {"template": "gemma"},
        "context_window": 2048,
        "n_seq_max": 1,
        "draft_strategy": "none",
    }
    models = {
        "audio": ModelConfig.model_validate({**common, "projector_path": multimodal_paths.audio}),
        "vision": ModelConfig.model_validate({**common, "projector_path": multimodal_paths.vision}),
    }
    base = tmp_path_factory.mktemp("kronk-transcriptions")
    # A small media max_bytes: a file past it is refused as any media item is.
    return Kronk(KronkConfig(base_path=base, models=models, media=MediaConfig(max_bytes=100_000)))


@pytest.fixture(scope="module")
def client(kronk: Kronk, serve: Serve) -> Iterator[OpenAI]:
    with (
        serve(create_app(ServerSettings(), kronk=kronk)) as url,
        OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client,
    ):
        yield client


def sound() -> tuple[str, bytes, str]:
    return ("speech.wav", wav(440, seconds=SECONDS), "audio/wav")


async def test_the_transcript_is_the_models_answer_to_the_sound_and_the_instruction(
    kronk: Kronk, client: OpenAI
) -> None:
    """The route's text equals a chat with the same user turn (instruction, then the sound),
    run greedily; language and prompt go into the instruction."""
    text = client.audio.transcriptions.create(
        model="audio", file=sound(), language="de", prompt="Kronk", temperature=0
    ).text
    transcription = Transcription(Media.from_bytes(sound()[1]), language="de", prompt="Kronk")
    assert "The speech is in de." in transcription.instruction
    assert "Kronk" in transcription.instruction
    request = transcription_request(transcription, model="audio")
    replay = await kronk.chat(request.messages, model="audio", temperature=0, max_tokens=70)
    assert text == replay.content.strip()
    assert request.max_tokens == 64 + 6  # 12 a second of sound, at least 64
    transcript = await kronk.transcribe(sound()[1], model="audio", language="de", prompt="Kronk")
    assert transcript.text == text and transcript.seconds == pytest.approx(SECONDS)


def test_every_response_format(client: OpenAI) -> None:
    plain = client.audio.transcriptions.create(model="audio", file=sound())
    text = plain.text
    assert plain.usage is not None and plain.usage.type == "tokens"
    assert plain.usage.input_tokens > 0 and plain.usage.output_tokens > 0

    as_text = client.audio.transcriptions.create(
        model="audio", file=sound(), response_format="text"
    )
    assert as_text == text + "\n"

    srt = client.audio.transcriptions.create(model="audio", file=sound(), response_format="srt")
    assert srt == f"1\n00:00:00,000 --> 00:00:00,500\n{text}\n\n"
    vtt = client.audio.transcriptions.create(model="audio", file=sound(), response_format="vtt")
    assert vtt == f"WEBVTT\n\n00:00:00.000 --> 00:00:00.500\n{text}\n\n"

    verbose = client.audio.transcriptions.create(
        model="audio", file=sound(), response_format="verbose_json"
    )
    assert (verbose.text, verbose.language, verbose.duration) == (text, "unknown", SECONDS)
    english = client.audio.transcriptions.create(model="audio", file=sound(), language="en")
    in_english = client.audio.transcriptions.create(
        model="audio",
        file=sound(),
        response_format="verbose_json",
        timestamp_granularities=["segment"],
        language="en",
    )
    assert (in_english.text, in_english.language) == (english.text, "en")
    assert verbose.segments is not None
    (segment,) = verbose.segments
    assert (segment.id, segment.start, segment.end, segment.text) == (0, 0.0, SECONDS, text)
    assert segment.compression_ratio > 0

    with_logprobs = client.audio.transcriptions.create(
        model="audio", file=sound(), include=["logprobs"]
    )
    assert with_logprobs.logprobs is not None
    assert with_logprobs.text == text and with_logprobs.usage is not None
    assert len(with_logprobs.logprobs) == with_logprobs.usage.output_tokens  # type: ignore[union-attr]
    assert all(item.logprob is not None and item.logprob <= 0 for item in with_logprobs.logprobs)


def test_a_streamed_transcript_arrives_as_text_deltas(client: OpenAI) -> None:
    text = client.audio.transcriptions.create(model="audio", file=sound()).text
    events = list(client.audio.transcriptions.create(model="audio", file=sound(), stream=True))
    deltas = [event for event in events if event.type == "transcript.text.delta"]
    done = events[-1]
    assert done.type == "transcript.text.done"
    assert done.text == text == "".join(event.delta for event in deltas).strip()
    assert len(deltas) > 1


def test_a_translation_asks_for_english(client: OpenAI, kronk: Kronk) -> None:
    with pytest.deprecated_call():  # the SDK marks translations deprecated; clients still call it
        translated = client.audio.translations.create(model="audio", file=sound())
    assert isinstance(translated.text, str) and translated.text
    instruction = Transcription(Media.from_bytes(sound()[1]), task="translate").instruction
    assert "into English" in instruction
    assert "language" in refusal(client, "translations", {"model": "audio", "language": "de"})


def refusal(client: OpenAI, route: str, fields: dict[str, str]) -> str:
    """A form the SDK would not send: its 400, in OpenAI's shape; the message."""
    response = httpx.post(
        f"{client.base_url}audio/{route}", data=fields, files={"file": sound()}, timeout=60
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    return str(error["message"])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"response_format": "diarized_json"}, "response_format"),
        ({"timestamp_granularities[]": "word"}, "timestamp_granularities"),
        ({"timestamp_granularities[]": "segment"}, "needs response_format verbose_json"),
        ({"stream": "true", "response_format": "srt"}, "srt is not streamed"),
        ({"temperature": "1.5"}, "temperature"),
        ({"known_speaker_names[]": "Ann"}, "known_speaker_names"),
    ],
)
def test_what_is_not_served_is_a_400_that_names_it(
    client: OpenAI, fields: dict[str, str], message: str
) -> None:
    assert message in refusal(client, "transcriptions", {"model": "audio", **fields})


def test_refusals_in_openais_shape(client: OpenAI) -> None:
    with pytest.raises(BadRequestError, match="vision does not read sound"):
        client.audio.transcriptions.create(model="vision", file=sound())
    with pytest.raises(NotFoundError):
        client.audio.transcriptions.create(model="no-such", file=sound())
    with pytest.raises(BadRequestError, match="not a sound"):
        client.audio.transcriptions.create(
            model="audio", file=("a.png", image((255, 0, 0)), "image/png")
        )
    with pytest.raises(BadRequestError, match="not an image or sound"):
        client.audio.transcriptions.create(model="audio", file=("a.txt", b"hello", "text/plain"))
    with pytest.raises(BadRequestError, match="media max_bytes is 100000"):
        client.audio.transcriptions.create(
            model="audio", file=("long.wav", wav(440, seconds=4), "audio/wav")
        )
    with pytest.raises(BadRequestError, match="1 Hz"):
        client.audio.transcriptions.create(
            model="audio", file=("a.wav", raw_wav(bytes(1000), rate=1), "audio/wav")
        )
    url = str(client.base_url)
    missing = httpx.post(f"{url}audio/transcriptions", files={"model": (None, "audio")})
    assert missing.status_code == 400
    assert missing.json()["error"]["message"] == "missing required field: file"
    as_json = httpx.post(f"{url}audio/transcriptions", json={"model": "audio"})
    assert as_json.status_code == 400
    assert "multipart/form-data" in as_json.json()["error"]["message"]
    # The server still answers.
    assert client.audio.transcriptions.create(model="audio", file=sound()).text is not None


def test_a_file_object_uploads_as_the_sdk_sends_it(client: OpenAI) -> None:
    upload = io.BytesIO(wav(440, seconds=SECONDS))
    upload.name = "speech.wav"
    assert client.audio.transcriptions.create(model="audio", file=upload).text


def test_the_other_dialects_say_where_sound_goes(client: OpenAI) -> None:
    """Anthropic's API has no sound blocks: one is a 400 in its shape that names the route;
    Ollama's `images` take a sound too (the bytes say what they are), and a model that reads
    none answers with the 400 of its projector, in Ollama's shape."""
    url = str(client.base_url).removesuffix("/v1/")
    clip = base64.b64encode(sound()[1]).decode()
    block = {
        "type": "audio",
        "source": {"type": "base64", "media_type": "audio/wav", "data": clip},
    }
    with (
        anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0) as claude,
        pytest.raises(anthropic.BadRequestError) as refused,
    ):
        claude.messages.create(
            model="audio",
            max_tokens=4,
            messages=[{"role": "user", "content": [block]}],  # type: ignore[list-item]
        )
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "/v1/audio/transcriptions" in refused.value.message
    speaker = ollama.Client(host=url)
    heard = speaker.chat(
        model="audio",
        messages=[{"role": "user", "content": "What is said?", "images": [sound()[1]]}],
        options={"num_predict": 4},
    )
    assert heard.done_reason == "length"
    with pytest.raises(ollama.ResponseError) as not_heard:
        speaker.chat(
            model="vision",
            messages=[{"role": "user", "content": "What is said?", "images": [sound()[1]]}],
            options={"num_predict": 4},
        )
    assert not_heard.value.status_code == 400
    assert "reads vision input, not audio" in not_heard.value.error
