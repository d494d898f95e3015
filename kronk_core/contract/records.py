"""Records handed to observability hooks, and the id of the request being served.

Times are `time.monotonic()` seconds (0.0: the moment did not happen); an
observer that needs wall-clock time adds `time.time() - time.monotonic()`.
No record carries prompt or completion text.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from kronk_core.contract.types import Usage

# The id of the request being served: the server sets it from X-Request-ID, the
# engine sets it on its thread while it starts or finishes that request, and
# JSON log lines carry it.
current_request_id: ContextVar[str | None] = ContextVar("kronk_request_id", default=None)


def new_request_id() -> str:
    return uuid.uuid4().hex


@contextmanager
def request_scope(request_id: str) -> Iterator[None]:
    """Log lines written inside carry `request_id` (nesting allowed)."""
    token = current_request_id.set(request_id)
    try:
        yield
    finally:
        current_request_id.reset(token)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One generation as the engine ran it.

    The moments, in order: `enqueued_at` (submitted), `started_at` (given a
    slot), `cache_ready_at` (the cache strategy has put `cached_tokens` of the
    prompt into the slot), `prefilled_at` (the other `prefill_tokens` are
    decoded), `first_token_at` (the first token is sampled), `finished_at`.
    """

    request_id: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str
    queue_seconds: float
    time_to_first_token: float
    total_seconds: float
    slot: int = -1
    enqueued_at: float = 0.0
    started_at: float = 0.0
    cache_ready_at: float = 0.0
    prefilled_at: float = 0.0
    first_token_at: float = 0.0
    finished_at: float = 0.0

    @property
    def prefill_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def decode_seconds(self) -> float:
        """From the first token to the end (0.0 when no token was generated)."""
        return self.finished_at - self.first_token_at if self.first_token_at else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens after the first, per second of decoding (0.0: too few to say)."""
        seconds = self.decode_seconds
        if self.completion_tokens < 2 or not seconds:
            return 0.0
        return (self.completion_tokens - 1) / seconds


@dataclass(frozen=True, slots=True)
class ChatRecord:
    """One chat request as the SDK served it, from `start_chat` to the end of its stream.

    `prompt_started_at` is when the model was leased (loaded, if it had to be)
    and prompt creation began; `prompt_ready_at` when the prompt was rendered,
    tokenized and queued. `parse_seconds` is the time spent in the output
    parser (reasoning and tool-call markup), `tools` how many tools the
    request offered and `tool_calls` how many calls came out. `generation` is
    the engine's record, None when the request never reached a slot.
    """

    request_id: str
    model: str
    started_at: float
    prompt_started_at: float
    prompt_ready_at: float
    finished_at: float
    finish_reason: str
    usage: Usage
    tools: int = 0
    tool_calls: int = 0
    parse_seconds: float = 0.0
    generation: RequestRecord | None = None
