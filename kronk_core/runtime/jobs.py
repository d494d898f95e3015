"""The engine's record of a request (`Job`), the events it hands over, and a step's parts."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from kronk_core.contract.backend import Sampler
from kronk_core.contract.cache import Slot
from kronk_core.contract.drafts import Draft
from kronk_core.contract.generation import EngineEvent, GenerationRequest
from kronk_core.contract.media import MediaSpan
from kronk_core.contract.records import new_request_id
from kronk_core.contract.types import TokenLogprob
from kronk_core.runtime.detok import StopMatcher, Utf8Stream
from kronk_core.runtime.media_encoder import Encoding


@dataclass(eq=False)
class Job:
    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[EngineEvent]
    request_id: str = field(default_factory=new_request_id)
    enqueued_at: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    slot: Slot | None = None
    sampler: Sampler | None = None
    next_prompt_index: int = 0
    cached_tokens: int = 0
    pending_token: int | None = None
    batch_index: int = -1
    completion_tokens: int = 0
    accepted_tokens: int = 0
    rejected_tokens: int = 0
    started_at: float = 0.0
    cache_ready_at: float = 0.0
    prefilled_at: float = 0.0
    first_token_at: float = 0.0
    utf8: Utf8Stream = field(default_factory=Utf8Stream)
    stops: StopMatcher | None = None
    # Overlapped decoding: tokens sampled and counted whose text is not handed over yet,
    # and whether handing them over found a stop string (the request then ends).
    undelivered: list[tuple[int, tuple[TokenLogprob, ...]]] = field(default_factory=list)
    stopped: bool = False
    # The media chunks its prompt still needs in the KV, oldest first, as they encode.
    encodings: deque[Encoding] = field(default_factory=deque)
    # n > 1: a request's first choice carries the others (each with the slot held for it once
    # the first starts) until its prompt is in the KV; each then starts with `copy_from`, the
    # first choice's slot, whose prompt it copies instead of prefilling it again.
    followers: list[Job] = field(default_factory=list)
    copy_from: Slot | None = None
    choice: int = 0  # its index among its request's choices
    # Its slot's window was shifted: the KV past `request.shift_keep` holds moved positions,
    # which no later request may reuse.
    shifted: bool = False

    @property
    def prefilling(self) -> bool:
        return self.next_prompt_index < len(self.request.prompt_tokens)

    def next_span(self) -> MediaSpan | None:
        """The media chunk that the rest of the prompt meets first, if any."""
        return self.encodings[0].span if self.encodings else None

    def deliver(self, event: EngineEvent) -> None:
        """Hand an event to the consumer's loop; a closed loop means the consumer is gone."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:
            self.cancelled = True


class Outbox:
    """Events the engine thread produced, handed over once per step and event loop.

    Each `call_soon_threadsafe` wakes the loop through its self-pipe (a system call);
    one per step instead of one per token and slot.
    """

    def __init__(self) -> None:
        self._events: dict[asyncio.AbstractEventLoop, list[tuple[Job, EngineEvent]]] = {}

    def post(self, job: Job, event: EngineEvent) -> None:
        self._events.setdefault(job.loop, []).append((job, event))

    def flush(self) -> None:
        events, self._events = self._events, {}
        for loop, posted in events.items():
            try:
                loop.call_soon_threadsafe(_put_all, posted)
            except RuntimeError:  # the loop is closed: its consumers are gone
                for job, _ in posted:
                    job.cancelled = True


def _put_all(posted: list[tuple[Job, EngineEvent]]) -> None:
    for job, event in posted:
        job.events.put_nowait(event)


@dataclass(frozen=True, slots=True)
class Part:
    """One job's tokens in a step: its pending generated token, or a prompt chunk.

    `completes`: the chunk ends the prompt. A generated token, and a chunk
    that completes the prompt, need the logits of their last token. A
    generated token may be followed by its `draft`'s tokens, which need logits
    too.
    """

    job: Job
    tokens: Sequence[int]
    start: int
    generated: bool
    completes: bool = False
    draft: Draft | None = None

    @property
    def sample(self) -> bool:
        return self.generated or self.completes


@dataclass(frozen=True, slots=True)
class MediaPart:
    """`count` rows of a media chunk's embeddings from `offset`, decoded in a step."""

    job: Job
    encoding: Encoding
    offset: int
    count: int

    @property
    def start(self) -> int:
        return self.encoding.span.start + self.offset


def rows(parts: Sequence[Part]) -> tuple[int, int]:
    """A step's logit rows (generated tokens, drafts, completing chunks) and prompt tokens."""
    rows = prefill = 0
    for part in parts:
        if part.generated:
            rows += len(part.tokens)
        else:
            prefill += len(part.tokens)
            rows += part.completes
    return rows, prefill
