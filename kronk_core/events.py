"""Records handed to observability hooks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One finished generation, without prompt or completion text."""

    request_id: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str
    queue_seconds: float
    time_to_first_token: float
    total_seconds: float
