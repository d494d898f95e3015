"""Speech to text on a model that reads sound (its projector takes audio: Ultravox,
Voxtral, Qwen2-Audio and the like): the sound and an instruction go to the model as one
user turn, and its answer is the transcript. OpenAI's /v1/audio/transcriptions and
/v1/audio/translations are built on it, and the SDK's `Kronk.transcribe`.

Such a model writes text, not timestamps: a transcript is one segment from the start of the
sound to its end (the length its header declares).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Literal

from kronk_core.contract.errors import CapabilityError, InvalidRequestError
from kronk_core.contract.media import Media, MediaKind
from kronk_core.contract.sound import read_sound_header
from kronk_core.contract.types import ChatRequest, ChatResult, FinishReason, TokenLogprob, Usage
from kronk_core.inputs import chat_request

Task = Literal["transcribe", "translate"]

# The default bound of a transcript: speech is 2-4 words a second.
TOKENS_PER_SECOND = 12
TOKENS_AT_LEAST = 64

_INSTRUCTIONS: dict[Task, str] = {
    "transcribe": (
        "Transcribe the speech in this audio exactly as it is spoken, in the language it is "
        "spoken in. Answer with the transcript only."
    ),
    "translate": (
        "Translate the speech in this audio into English. Answer with the English translation only."
    ),
}


@dataclass(frozen=True, slots=True)
class Transcription:
    """What to do with one sound: write down what is said (`transcribe`) or say it in
    English (`translate`). `language` is the speech's language as the caller knows it (an
    ISO-639-1 code such as "de", or a name); `prompt` is text the transcript should follow
    (the words before it, the spelling of names)."""

    audio: Media
    task: Task = "transcribe"
    language: str | None = None
    prompt: str | None = None

    def __post_init__(self) -> None:
        if self.audio.kind is not MediaKind.audio:
            raise InvalidRequestError(
                f"file: holds {self.audio.media_type}, not a sound (WAV, MP3 or FLAC)",
                param="file",
            )
        if self.task not in _INSTRUCTIONS:
            raise InvalidRequestError(
                f"task: {self.task!r} is not one of {', '.join(_INSTRUCTIONS)}", param="task"
            )

    @property
    def instruction(self) -> str:
        lines = [_INSTRUCTIONS[self.task]]
        if self.language:
            lines.append(f"The speech is in {self.language}.")
        if self.prompt:
            lines.append(f"Follow the wording and spelling of this text: {self.prompt}")
        return "\n".join(lines)

    @property
    def seconds(self) -> float:
        """How long the sound is, as its header declares (MediaError if it has none)."""
        return read_sound_header(self.audio.data, where="file").seconds


@dataclass(frozen=True, slots=True)
class Transcript:
    """A transcript, or a translation (`task`), of a sound `seconds` long."""

    text: str
    task: Task
    language: str | None
    seconds: float
    finish_reason: FinishReason
    usage: Usage
    temperature: float = 0.0
    logprobs: list[TokenLogprob] = field(default_factory=list)

    @property
    def average_logprob(self) -> float | None:
        """The mean log probability of the transcript's tokens (None without logprobs)."""
        if not self.logprobs:
            return None
        return sum(item.logprob for item in self.logprobs) / len(self.logprobs)

    @property
    def compression_ratio(self) -> float:
        """Whisper's repetition signal: the text's bytes over their zlib-compressed bytes
        (a model that loops writes text that compresses well)."""
        data = self.text.encode()
        return len(data) / len(zlib.compress(data)) if data else 0.0


def transcription_request(
    transcription: Transcription,
    *,
    model: str | None = None,
    temperature: float = 0.0,
    max_tokens: int | None = None,
    logprobs: bool = False,
) -> ChatRequest:
    """The chat request that asks `model` for the transcript (`Kronk.start_chat` streams it).

    Without `max_tokens` it stops at TOKENS_PER_SECOND for each second of sound and
    TOKENS_AT_LEAST: far more than speech holds, so only a model caught in a loop (the
    known failure of speech models) reaches it."""
    if max_tokens is None:
        max_tokens = TOKENS_AT_LEAST + math.ceil(TOKENS_PER_SECOND * transcription.seconds)
    message = {"role": "user", "content": [transcription.instruction, transcription.audio]}
    return chat_request(
        [message],
        model=model,
        temperature=temperature,
        max_tokens=max_tokens,
        logprobs=logprobs,
    )


def check_reads_sound(model_id: str, media: frozenset[MediaKind]) -> None:
    """CapabilityError unless the model's projector reads sound."""
    if MediaKind.audio not in media:
        raise CapabilityError(
            f"{model_id} does not read sound: transcription needs a model whose projector "
            "reads audio (see docs/vision.md)",
            param="model",
        )


def transcript_of(
    transcription: Transcription, result: ChatResult, *, temperature: float = 0.0
) -> Transcript:
    return Transcript(
        text=result.content.strip(),
        task=transcription.task,
        language=transcription.language,
        seconds=transcription.seconds,
        finish_reason=result.finish_reason,
        usage=result.usage,
        temperature=temperature,
        logprobs=result.logprobs,
    )
