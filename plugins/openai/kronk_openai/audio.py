"""POST /v1/audio/transcriptions and /v1/audio/translations, OpenAI's speech to text: a
multipart upload in; the transcript as json, text, srt, vtt or verbose_json out, or
streamed as `transcript.text.delta` events. Served by a model whose projector reads sound
(kronk_core.transcription)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

from litestar import Request, Response, post
from litestar.datastructures import UploadFile
from litestar.response import Stream
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kronk_api.contract import ENDPOINT_OPT, invalid_body, kronk_of, sse_frame, subject_of
from kronk_core.contract import (
    ChatDelta,
    InvalidRequestError,
    Media,
    Task,
    TokenLogprob,
    Transcript,
    Transcription,
    Usage,
    collect,
    transcript_of,
)
from kronk_openai.errors import OPENAI

ResponseFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]
# What each format is sent as.
_MEDIA_TYPES = {
    "json": "application/json",
    "verbose_json": "application/json",
    "text": "text/plain; charset=utf-8",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
}


class TranslationForm(BaseModel):
    """The form fields of /v1/audio/translations (the file apart); unknown ones are a 400."""

    model_config = ConfigDict(extra="forbid")

    model: str
    prompt: str | None = None
    response_format: ResponseFormat = "json"
    temperature: float = Field(0.0, ge=0.0, le=1.0)


class TranscriptionForm(TranslationForm):
    """/v1/audio/transcriptions adds the language, streaming, logprobs and the timestamp
    granularities (segments only: the model writes no timing of words)."""

    language: str | None = None
    stream: bool = False
    include: list[Literal["logprobs"]] = []
    timestamp_granularities: list[Literal["segment"]] = []
    chunking_strategy: Literal["auto"] | None = None

    @model_validator(mode="after")
    def _combinations(self) -> TranscriptionForm:
        if self.timestamp_granularities and self.response_format != "verbose_json":
            raise ValueError("timestamp_granularities needs response_format verbose_json")
        if self.stream and self.response_format not in ("json", "text"):
            raise ValueError(f"response_format {self.response_format} is not streamed")
        return self


# Form fields that OpenAI's clients send as arrays (`include[]=logprobs`).
_LISTS = ("include", "timestamp_granularities")


async def _read_form(
    request: Request[Any, Any, Any], form_type: type[TranslationForm]
) -> tuple[TranslationForm, Media]:
    """The form's fields as `form_type` and its file as a sound."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise InvalidRequestError(
            "the request must be multipart/form-data with the sound in its `file` field"
        )
    try:
        form = await request.form()
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(f"a form field is not valid UTF-8: {exc.reason}") from None
    fields: dict[str, Any] = {}
    upload: UploadFile | None = None
    for key, value in form.multi_items():
        if key == "file":
            if not isinstance(value, UploadFile):
                raise InvalidRequestError("file: must be a file upload", param="file")
            upload = value
            continue
        if isinstance(value, UploadFile):
            raise InvalidRequestError(f"{key}: must be a value, not a file", param=key)
        name = key.removesuffix("[]")
        if name in _LISTS:
            fields.setdefault(name, []).append(value)
        elif name in fields:
            raise InvalidRequestError(f"{name}: given more than once", param=name)
        else:
            fields[name] = value
    try:
        parsed = form_type.model_validate(fields)
    except ValidationError as exc:
        raise invalid_body(exc) from None
    if upload is None:
        raise InvalidRequestError("missing required field: file", param="file")
    data = await upload.read()  # its size is checked with every media item's (check_media)
    if not data:
        raise InvalidRequestError("file: is empty", param="file")
    return parsed, Media.from_bytes(data, upload.content_type or None, where="file")


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "type": "tokens",
        "input_tokens": usage.prompt_tokens,
        "output_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def _logprobs(items: list[TokenLogprob]) -> list[dict[str, Any]]:
    return [{"token": i.token, "logprob": i.logprob, "bytes": list(i.bytes)} for i in items]


def _clock(seconds: float, separator: str) -> str:
    milliseconds = round(seconds * 1000)
    hours, rest = divmod(milliseconds, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, milliseconds = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{whole:02d}{separator}{milliseconds:03d}"


def formatted(transcript: Transcript, response_format: ResponseFormat, logprobs: bool) -> Any:
    """The answer in `response_format`: a dict for the JSON ones, text for the rest. The
    transcript is one segment, the whole sound."""
    end = transcript.seconds
    if response_format == "text":
        return transcript.text + "\n"
    if response_format == "srt":
        return f"1\n{_clock(0, ',')} --> {_clock(end, ',')}\n{transcript.text}\n\n"
    if response_format == "vtt":
        return f"WEBVTT\n\n{_clock(0, '.')} --> {_clock(end, '.')}\n{transcript.text}\n\n"
    answer: dict[str, Any] = {"text": transcript.text}
    if response_format == "verbose_json":
        segment = {
            "id": 0,
            "seek": 0,
            "start": 0.0,
            "end": end,
            "text": transcript.text,
            "temperature": transcript.temperature,
            "compression_ratio": transcript.compression_ratio,
        }
        if transcript.average_logprob is not None:
            segment["avg_logprob"] = transcript.average_logprob
        answer = {
            "task": transcript.task,
            "language": transcript.language or "unknown",
            "duration": end,
            "text": transcript.text,
            "segments": [segment],
        }
    if logprobs:
        answer["logprobs"] = _logprobs(transcript.logprobs)
    answer["usage"] = _usage(transcript.usage)
    return answer


async def _events(deltas: AsyncIterator[ChatDelta], logprobs: bool) -> AsyncIterator[bytes]:
    text: list[str] = []
    async for delta in deltas:
        if delta.content:
            text.append(delta.content)
            event: dict[str, Any] = {"type": "transcript.text.delta", "delta": delta.content}
            if logprobs:
                event["logprobs"] = _logprobs(list(delta.logprobs))
            yield sse_frame(event)
        if delta.finish_reason is not None:
            done = {
                "type": "transcript.text.done",
                "text": "".join(text).strip(),
                "usage": _usage(delta.usage or Usage()),
            }
            yield sse_frame(done)


async def _answer(
    request: Request[Any, Any, Any], form: TranslationForm, transcription: Transcription
) -> Response[Any] | Stream:
    kronk = kronk_of(request)
    logprobs = isinstance(form, TranscriptionForm) and "logprobs" in form.include
    stream = await kronk.start_transcription(
        transcription,
        model=form.model,
        subject=subject_of(request),
        temperature=form.temperature,
        logprobs=logprobs,
    )
    if isinstance(form, TranscriptionForm) and form.stream:
        return await OPENAI.open_stream(
            request, aiter(stream), lambda deltas: _events(deltas, logprobs)
        )
    result = await OPENAI.respond(request, collect(stream))
    if isinstance(result, Response):
        return result
    transcript = transcript_of(transcription, result, temperature=form.temperature)
    return Response(
        formatted(transcript, form.response_format, logprobs),
        media_type=_MEDIA_TYPES[form.response_format],
    )


async def _serve(request: Request[Any, Any, Any], task: Task) -> Response[Any] | Stream:
    form_type = TranscriptionForm if task == "transcribe" else TranslationForm
    form, media = await _read_form(request, form_type)
    language = form.language if isinstance(form, TranscriptionForm) else None
    transcription = Transcription(media, task=task, language=language, prompt=form.prompt)
    return await _answer(request, form, transcription)


@post("/v1/audio/transcriptions", status_code=200, opt={ENDPOINT_OPT: "transcriptions"})
async def transcriptions(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
    """OpenAI transcriptions: a sound file in, its text out (a model with an audio projector)."""
    return await _serve(request, "transcribe")


@post("/v1/audio/translations", status_code=200, opt={ENDPOINT_OPT: "transcriptions"})
async def translations(request: Request[Any, Any, Any]) -> Response[Any] | Stream:
    """OpenAI translations: a sound file in, its English text out (a model with an audio
    projector)."""
    return await _serve(request, "translate")


AUDIO_ROUTES = [transcriptions, translations]
