"""Kronk core: the SDK facade and the request path; the plugin contract in `contract`, the
engine, pool and loading in `runtime`, configuration in `settings`."""

from kronk_core import grammar_presets
from kronk_core.contract.media import Media, MediaConfig
from kronk_core.contract.plugins import hookimpl
from kronk_core.contract.types import (
    ChatDelta,
    ChatMessage,
    ChatRequest,
    ChatResult,
    FinishReason,
    Usage,
)
from kronk_core.sdk import ChatStream, Kronk, LoadedModel
from kronk_core.settings.config import KronkConfig, ModelConfig, SamplingConfig
from kronk_core.transcription import Transcript, Transcription

__version__ = "0.1.0"

__all__ = [
    "ChatDelta",
    "ChatMessage",
    "ChatRequest",
    "ChatResult",
    "ChatStream",
    "FinishReason",
    "Kronk",
    "KronkConfig",
    "LoadedModel",
    "Media",
    "MediaConfig",
    "ModelConfig",
    "SamplingConfig",
    "Transcript",
    "Transcription",
    "Usage",
    "grammar_presets",
    "hookimpl",
]
