"""The batch engine: one worker thread per loaded text model, continuous batching over slots.

The thread is the engine's own unless the model chooses one (`HostingModel`: the
llamacpp plugin runs a CPU model's loop on the thread that computes, so a decode needs
no hand-over between threads).

Each step builds ONE batch holding a token for every generating slot plus
prompt chunks for prefilling slots (bounded by n_batch), runs one decode, then
samples, detokenizes and checks stop conditions per slot. With a draft
strategy (speculative decoding), a generating slot's token may carry draft
tokens behind it; kronk_core/runtime/speculation.py decides which of them stand. The
asyncio side talks to the thread only through a bounded request queue and
per-request output queues fed with `loop.call_soon_threadsafe`.

Where the backend's decode returns before the device has finished
(`ModelInfo.overlap_decode`, a GPU), a step's tokens are sampled and counted
at once (end of generation, max_tokens and the window are known from the ids),
the next decode is launched, and only then is their text worked out and handed
over (detokenizing, stop strings, events) while the device computes. A stop
string found that way ends the request after the decode in flight, whose token
for it stays in the slot's KV and its record.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import replace

from kronk_core.contract.backend import (
    AdaptedModel,
    Batch,
    EngineThread,
    HostingModel,
    MediaModel,
    ShiftableModel,
    StrategyModel,
)
from kronk_core.contract.cache import CacheCounters, CacheStrategy, Slot
from kronk_core.contract.drafts import Draft, DraftStrategy
from kronk_core.contract.errors import (
    BackendLostError,
    EngineClosedError,
    InvalidRequestError,
    KronkError,
    QueueFullError,
)
from kronk_core.contract.generation import EngineEvent, Finished, GenerationRequest, TextChunk
from kronk_core.contract.media import MediaSpan, cut_point
from kronk_core.contract.records import RequestRecord, request_scope
from kronk_core.contract.sampling import SamplerStage
from kronk_core.contract.tokens import common_prefix
from kronk_core.contract.types import Adapters, FinishReason, SamplingParams, TokenLogprob, Usage
from kronk_core.runtime.detok import StopMatcher
from kronk_core.runtime.engine_thread import OwnThread
from kronk_core.runtime.jobs import Job, MediaPart, Outbox, Part, rows
from kronk_core.runtime.media_encoder import MediaEncoder
from kronk_core.runtime.reports import EngineStats, SlotState, StepRecord
from kronk_core.runtime.speculation import Speculating, Speculation

log = logging.getLogger(__name__)

_IDLE_WAIT_SECONDS = 0.1


def _wake_waiter(room: asyncio.Future[None]) -> None:
    if not room.done():  # a submitter that gave up cancelled it
        room.set_result(None)


class GenerationStream:
    """The consumer's end of one request: an async iterator of engine events.

    Leaving the iteration early (break, exception, aclose) cancels the request;
    the engine frees its slot within one step.
    """

    def __init__(self, engine: Engine, job: Job, events: asyncio.Queue[EngineEvent]) -> None:
        self._engine = engine
        self._job = job
        self._events = events
        self._done = False

    def __aiter__(self) -> AsyncIterator[EngineEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[EngineEvent]:
        try:
            while not self._done:
                event = await self._events.get()
                if isinstance(event, Finished):
                    self._done = True
                yield event
        finally:
            self.cancel()

    @property
    def enqueued_at(self) -> float:
        """When the request was queued (monotonic)."""
        return self._job.enqueued_at

    def cancel(self) -> None:
        """Stop the request, unless it has finished (its Finished event was read)."""
        if not self._done:
            self._engine.cancel(self._job)


class Engine:
    """Owns a text model and runs every request for it on one worker thread; its cache
    strategy is handed the model (a StrategyModel)."""

    def __init__(
        self,
        model: StrategyModel,
        *,
        n_batch: int,
        queue_depth: int,
        cache: CacheStrategy,
        sampler_stages: Callable[[SamplingParams], Sequence[SamplerStage]],
        on_finished: Callable[[RequestRecord], None] | None = None,
        drafter: DraftStrategy | None = None,
    ) -> None:
        self.model = model
        self.n_ctx_per_seq = model.info.n_ctx_per_seq
        self.n_batch = n_batch
        self.slots = [Slot(id=i, seq_id=i) for i in range(model.info.n_seq_max)]
        self._cache = cache
        self._sampler_stages = sampler_stages
        self._on_finished = on_finished
        # The engine owns the draft strategy from here on and closes it when it stops.
        self._speculation = None if drafter is None else Speculation(model, drafter, n_batch)
        # Context shift's KV operations, where the model can move positions (the load
        # refuses `context_shift` elsewhere, so no request asks for it there).
        self._shifter = model if isinstance(model, ShiftableModel) else None
        # LoRA adapters: one set per decode, the one the last step applied (`_turn`).
        self._adapted = model if model.info.adapters and isinstance(model, AdaptedModel) else None
        self._adapters: Adapters = ()
        self._turns = 0
        self._media: MediaEncoder | None = None
        if isinstance(model, MediaModel) and model.info.media:
            self._media = MediaEncoder(model, self._wake_up)
        # Requests waiting for a slot, oldest first; the asyncio side appends and
        # removes cancelled ones, the engine thread takes them.
        self._waiting: deque[Job] = deque()
        self._waiting_lock = threading.Lock()
        # Submitters waiting for room in a full queue, woken when a request leaves it.
        self._room_waiters: list[asyncio.Future[None]] = []
        # The prompts of requests the cache strategy holds back until a prefilling slot
        # holds a prefix they share (`_admit`); that slot's chunks stop there (`_step`).
        self._held_prompts: list[Sequence[int]] = []
        self._capacity = len(self.slots) * queue_depth
        self._active: list[Job] = []
        self._outbox = Outbox()
        self._overlap = model.info.overlap_decode
        self._delivering: list[Job] = []  # jobs with undelivered tokens, in order
        self._stopping = False
        self._lost: BackendLostError | None = None  # why the engine stopped on its own
        self._step_listeners: list[Callable[[StepRecord], None]] = []
        self._steps = 0
        self._step_started: float | None = None
        # Slot id -> the last prompt prefilled in it, and where its last chunk began: where
        # a reproducible request goes back to, and what it decodes again (`_home`).
        self._last_prompts: dict[int, tuple[Sequence[int], int]] = {}
        self._generated = 0
        self._prefilled = 0
        name = f"kronk-engine-{model.info.id}"
        chosen = model.engine_thread(name) if isinstance(model, HostingModel) else None
        self._thread: EngineThread = chosen or OwnThread(name)
        self._thread.start(self._run)

    # ---- asyncio side -------------------------------------------------------

    async def submit(
        self, request: GenerationRequest, *, wait: float, request_id: str | None = None
    ) -> GenerationStream:
        """Queue a request; waits up to `wait` seconds for queue space, then QueueFullError.

        `request_id` names it in log lines and its RequestRecord (default: a new id).
        """
        return (await self.submit_choices((request,), wait=wait, request_id=request_id))[0]

    async def submit_choices(
        self,
        requests: Sequence[GenerationRequest],
        *,
        wait: float,
        request_id: str | None = None,
    ) -> list[GenerationStream]:
        """Queue the choices of one request (n > 1): the same prompt, each with its own
        sampling. They start together, each in a slot of its own: the first prefills the
        prompt, the others then copy it from its slot and decode only its last token, and
        all of them generate in the same steps. Choice i's id is `request_id`-i (i > 0).
        """
        if not self.alive:
            closed = EngineClosedError(f"the engine of {self.model.info.id} is not running")
            raise self._lost or closed
        if len(requests) > len(self.slots):
            raise InvalidRequestError(
                f"n: {len(requests)} choices need as many slots, and {self.model.info.id} has "
                f"{len(self.slots)} (its n_seq_max)",
                param="n",
            )
        loop = asyncio.get_running_loop()
        jobs = [Job(request=request, loop=loop, events=asyncio.Queue()) for request in requests]
        first = jobs[0]
        first.request_id = request_id or first.request_id
        for index, job in enumerate(jobs[1:], start=1):
            job.request_id, job.choice = f"{first.request_id}-{index}", index
        first.followers = jobs[1:]
        deadline = time.monotonic() + wait
        while (room := self._enqueue(first, loop)) is not None:
            try:
                await asyncio.wait_for(room, max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise QueueFullError(
                    f"the request queue for {self.model.info.id} is full "
                    f"({self._capacity} waiting); retry later",
                    retry_after=max(1, int(wait) or 1),
                ) from None
            if not self.alive:  # the queue emptied because the engine stopped
                raise self._lost or EngineClosedError(f"{self.model.info.id} was unloaded")
        self._thread.wake()
        return [GenerationStream(self, job, job.events) for job in jobs]

    def _enqueue(self, job: Job, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None] | None:
        """Queue the job; where the queue is full, a future done once a request left it."""
        with self._waiting_lock:
            if len(self._waiting) < self._capacity:
                self._waiting.append(job)
                return None
            room = loop.create_future()
            self._room_waiters.append(room)
            return room

    def _room_made(self) -> None:
        """A request left the queue: wake whoever waits for room (under _waiting_lock)."""
        waiters, self._room_waiters = self._room_waiters, []
        for room in waiters:
            room.get_loop().call_soon_threadsafe(_wake_waiter, room)

    def cancel(self, job: Job) -> None:
        """Cancel a request: a waiting one leaves the queue now, a running one within a step."""
        job.cancelled = True
        with self._waiting_lock:
            try:
                index = self._waiting.index(job)
            except ValueError:
                pass
            else:
                del self._waiting[index]
                self._room_made()
                job.deliver(Finished(FinishReason.cancelled, Usage()))
                if job.followers:  # the request's next choice waits in its place
                    heir, *rest = job.followers
                    heir.followers, job.followers = rest, []
                    self._waiting.insert(index, heir)
        self._thread.wake()

    def sampler_stages(self, params: SamplingParams) -> Sequence[SamplerStage]:
        """The sampler stages the plugins make of `params` for this model."""
        return self._sampler_stages(params)

    def add_step_listener(self, listener: Callable[[StepRecord], None]) -> None:
        """Call listener(record) on the engine thread after every decode step."""
        self._step_listeners.append(listener)

    def remove_step_listener(self, listener: Callable[[StepRecord], None]) -> None:
        self._step_listeners.remove(listener)

    def slot_states(self) -> list[SlotState]:
        """Read from any thread: a momentary, not transactional, view."""
        now = time.monotonic()
        states = []
        for slot in self.slots:
            state = SlotState(
                id=slot.id,
                cached_tokens=len(slot.tokens),
                idle_seconds=0.0 if slot.busy or not slot.last_used else now - slot.last_used,
                busy=slot.busy,
                pending=slot.pending,
                adapters=slot.adapters,
            )
            if self._speculation is not None:
                counts = self._speculation.counts(slot.id)
                state = replace(
                    state,
                    accepted_prediction_tokens=counts.accepted,
                    rejected_prediction_tokens=counts.rejected,
                    draft_acceptance=round(counts.acceptance, 3),
                )
            states.append(state)
        return states

    @property
    def draft_strategy(self) -> DraftStrategy | None:
        """The model's draft strategy (speculative decoding), if it has one."""
        return None if self._speculation is None else self._speculation.strategy

    def cache_counters(self) -> CacheCounters:
        return self._cache.counters()

    def stats(self) -> EngineStats:
        return EngineStats(
            steps=self._steps,
            queued=len(self._waiting),
            active=len(self._active),
            generated_tokens=self._generated,
            prefilled_tokens=self._prefilled,
        )

    @property
    def queue_capacity(self) -> int:
        """How many requests may wait for a slot (slots x queue_depth)."""
        return self._capacity

    @property
    def busy(self) -> bool:
        """True while requests are queued or running (the model pool never unloads it then)."""
        return bool(self._active) or bool(self._waiting)

    @property
    def step_started(self) -> float | None:
        """When the worker began what it is doing now (admitting requests, then one decode
        step), by time.monotonic(); None while it waits for work. Read without a lock from
        any thread (readiness tells a stuck engine by it)."""
        return self._step_started

    @property
    def alive(self) -> bool:
        """True while the worker thread runs and accepts requests."""
        return self._thread.is_alive() and not self._stopping

    def close(self) -> None:
        """Stop the worker; queued and running requests end with an error event."""
        self._stopping = True
        self._thread.wake()
        self._thread.join()
        if self._speculation is not None:
            self._speculation.close()
        if self._media is not None:
            self._media.close()

    def _wake_up(self) -> None:
        self._thread.wake()

    # ---- engine thread ------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._step_started = time.monotonic()
                self._reap_cancelled()
                self._admit()
                if not self._active:
                    self._outbox.flush()
                    self._step_started = None
                    self._thread.idle(_IDLE_WAIT_SECONDS)
                    continue
                if not self._step():
                    # Every active request waits for its media to encode: sleep till one is.
                    self._step_started = None
                    self._thread.idle(_IDLE_WAIT_SECONDS)
                self._outbox.flush()
        except BackendLostError as exc:
            log.error("engine for %s stopped: %s", self.model.info.id, exc.message)
            self._lost = exc
            for job in self._active:
                job.slot = None  # its cache strategy must not touch the model's memory now
            self._shutdown_jobs(exc)
        except Exception:
            log.exception("engine for %s crashed", self.model.info.id)
            self._shutdown_jobs(KronkError("the inference engine failed; see the server log"))
        else:
            self._shutdown_jobs(EngineClosedError("the model was unloaded"))

    def _shutdown_jobs(self, unloaded: KronkError) -> None:
        self._stopping = True
        for job in list(self._active):
            self._finish(job, FinishReason.error, error=unloaded)
        self._outbox.flush()
        with self._waiting_lock:
            waiting, self._waiting = list(self._waiting), deque()
            self._room_made()
        for job in waiting:
            for choice in (job, *job.followers):
                choice.deliver(Finished(FinishReason.error, Usage(), error=unloaded))

    def _reap_cancelled(self) -> None:
        for job in [job for job in self._active if job.cancelled]:
            self._finish(job, FinishReason.cancelled)

    def _admit(self) -> None:
        """Start waiting requests, oldest first, while slots are free.

        The cache strategy may hold one back while another slot prefills a
        prefix it can then copy; younger requests go ahead meanwhile.
        """
        held = 0
        self._held_prompts = []
        while not self._stopping:
            free = [slot for slot in self.slots if not slot.busy]
            if not free:
                return
            with self._waiting_lock:
                if held >= len(self._waiting):
                    return
                job = self._waiting[held]
                if len(free) <= len(job.followers):
                    return  # a request's choices start together: it waits for their slots
                # Only a slot under the request's LoRA adapters could give it a prefix.
                prefilling = [
                    (active.slot, active.request.prompt_tokens)
                    for active in self._active
                    if active.prefilling
                    and active.slot is not None
                    and active.request.adapters == job.request.adapters
                ]
                if prefilling and self._cache.admit_later(job.request, prefilling):
                    held += 1
                    self._held_prompts.append(job.request.prompt_tokens)
                    continue
                del self._waiting[held]
                self._room_made()
            with request_scope(job.request_id):
                self._start(job, free)
            self._reserve(job)

    def _start(self, job: Job, free: list[Slot]) -> None:
        slot = self._select(free, job.request)
        slot.busy = slot.pending = True
        job.slot = slot
        job.started_at = time.monotonic()
        self._active.append(job)
        try:
            slots = [other for other in self.slots if other.adapters == slot.adapters]
            plan = self._cache.prepare(slot, job.request, self.model, slots)
            reused = self._keep_whole_media(slot, job.request.media, plan.reused)
            reused = self._keep_before_last_chunk(slot, job.request, reused)
            reused = self._copy_prompt(job, slot, reused)
            job.cached_tokens = job.next_prompt_index = reused
            if self._media is not None:
                job.encodings.extend(
                    self._media.submit(span) for span in job.request.media if span.end > reused
                )
            job.cache_ready_at = time.monotonic()
            stages = job.request.stages
            job.sampler = self.model.new_sampler(
                self.sampler_stages(job.request.sampling) if stages is None else stages,
                seq_id=slot.seq_id,
                logits=job.request.logprobs,
            )
        except KronkError as exc:
            self._finish(job, FinishReason.error, error=exc)
            return
        except Exception as exc:
            # Whatever the strategy left half done, the slot starts over empty.
            self._finish(job, FinishReason.error, error=self._unexpected(exc, "preparing a slot"))
            self._reset(slot)
            return
        job.stops = StopMatcher(job.request.stop + job.request.end_strings)
        log.debug(
            "started in slot %d: %d prompt tokens, %d cached",
            slot.id,
            len(job.request.prompt_tokens),
            job.cached_tokens,
        )

    # ---- a request's choices (n > 1) ------------------------------------------------

    def _reserve(self, job: Job) -> None:
        """Hold a slot for each of a request's later choices while its first one prefills."""
        for follower in job.followers:
            free = [slot for slot in self.slots if not slot.busy]
            request = follower.request
            slot = self._select(free, request)
            slot.busy = slot.pending = True
            follower.slot = slot
            # A seeded or greedy request gives the same choices again only if its first
            # choice prefills in the cells it had: a held slot's last copy of the prompt
            # shares them, so it lets them go now (its KV is replaced by a copy anyway).
            if request.sampling.reproducible and common_prefix(slot.tokens, request.prompt_tokens):
                self._reset(slot)

    def _start_followers(self, job: Job) -> None:
        """The first choice's prompt is in its slot: the later choices start, in their held
        slots, from a copy of it (`_copy_prompt`)."""
        followers, job.followers = job.followers, []
        for follower in followers:
            slot = follower.slot
            assert slot is not None
            slot.busy = slot.pending = False
            follower.slot = None
            if follower.cancelled:
                follower.deliver(Finished(FinishReason.cancelled, Usage()))
                continue
            follower.copy_from = job.slot
            with request_scope(follower.request_id):
                self._start(follower, [slot])

    def _requeue_followers(self, job: Job) -> None:
        """The first choice ended before its prompt was in its KV: the later ones wait again,
        first in the queue, as a request of their own; their slots are free meanwhile."""
        followers, job.followers = job.followers, []
        waiting: list[Job] = []
        for follower in followers:
            if follower.slot is not None:
                follower.slot.busy = follower.slot.pending = False
                follower.slot = None
            if follower.cancelled:
                follower.deliver(Finished(FinishReason.cancelled, Usage()))
            else:
                waiting.append(follower)
        if waiting:
            waiting[0].followers = waiting[1:]
            with self._waiting_lock:
                self._waiting.appendleft(waiting[0])

    def _select(self, free: list[Slot], request: GenerationRequest) -> Slot:
        """The cache strategy's pick among the free slots whose KV was decoded under the
        request's LoRA adapters (or is empty); where none is, the least recently used,
        which the strategy evicts (no prefix it holds is the request's)."""
        adapters = request.adapters
        same = [slot for slot in free if slot.adapters == adapters or not slot.tokens]
        if same:
            slot = self._cache.select_slot(self._home(same, request), request, self.model)
        else:
            slot = min(free, key=lambda slot: slot.last_used)
            self._cache.evict(slot, self.model)
            if slot.tokens:  # a strategy that kept some: nothing of it may serve this request
                self._reset(slot)
        slot.adapters = adapters
        return slot

    def _copy_prompt(self, job: Job, slot: Slot, reused: int) -> int:
        """For a later choice, its prompt but the last token (whose logits it needs) copied
        from the first choice's slot, whatever the cache strategy kept: each choice starts
        from the same KV. Left as it is where that slot's window or recurrent state cannot
        be cut back to it (the choice then prefills what the strategy did not keep)."""
        source, job.copy_from = job.copy_from, None
        prompt = job.request.prompt_tokens
        keep = cut_point(job.request.media, len(prompt) - 1)
        if source is None or keep <= 0 or source.tokens[:keep] != list(prompt[:keep]):
            return reused
        if keep < len(source.tokens) and keep < self.model.trim_floor(source.seq_id):
            return reused
        self._reset(slot)
        self.model.seq_copy(source.seq_id, slot.seq_id, 0, keep)
        slot.tokens.extend(prompt[:keep])
        return keep

    def _keep_whole_media(self, slot: Slot, spans: Sequence[MediaSpan], reused: int) -> int:
        """The reused prefix, cut back to the start of a media chunk it ends inside."""
        return self._cut(slot, cut_point(spans, reused), reused)

    def _home(self, free: list[Slot], request: GenerationRequest) -> list[Slot]:
        """The slots a request may take: for a reproducible one (seeded or greedy) that a
        free slot prefilled last, that slot alone. How a sequence rounds depends on where its
        cells lie in the KV pool and on the batches that filled them (docs/caching.md,
        "Numerics"): there it decodes in the cells and the batches it had, so a repeat
        answers as before (with `_keep_before_last_chunk`)."""
        if request.sampling.reproducible:
            prompt = request.prompt_tokens
            for slot in free:
                last = self._last_prompts.get(slot.id)
                if last is not None and last[0] == prompt:
                    return [slot]
        return free

    def _keep_before_last_chunk(self, slot: Slot, request: GenerationRequest, reused: int) -> int:
        """For a reproducible request whose prompt is the one the slot decoded last (an
        identical repeat), the reused prefix cut back to where that prompt's last chunk
        began: the chunk is decoded again as it was, where prefilling only its last token
        would round otherwise."""
        prompt, start = self._last_prompts.pop(slot.id, ((), 0))
        repeat = request.sampling.reproducible and request.prompt_tokens == prompt
        if not (repeat and start < reused):
            return reused
        if self.model.trim_floor(slot.seq_id) > start:
            return reused  # a window or recurrent state that cannot go back so far
        return self._cut(slot, start, reused)

    def _cut(self, slot: Slot, keep: int, reused: int) -> int:
        """Keep `keep` of the slot's `reused` tokens; none where the cut fails."""
        if keep < reused:
            if self.model.seq_remove(slot.seq_id, keep, -1):
                del slot.tokens[keep:]
            else:
                self._reset(slot)
                keep = 0
        return keep

    def _step(self) -> bool:
        """One decode: a token for every generating slot, then prompt chunks up to n_batch.

        A media chunk's embeddings go in a decode call of their own after the tokens',
        within the same prompt budget. False when there was nothing to decode (every
        active request waits for its media to encode).
        """
        began = time.perf_counter()
        for job in list(self._active):  # a failed shift ends its job
            if job.pending_token is not None and job.slot is not None and self._window_full(job):
                self._shift(job)
        return any(self._step_jobs(jobs, began) for jobs in self._turn())

    def _turn(self) -> Iterator[list[Job]]:
        """The active requests by LoRA adapter set, whose turn first: a decode applies one
        set, so each set with work takes a step in turn (all of them, without adapters)."""
        if self._adapted is None:
            yield self._active
            return
        groups: dict[Adapters, list[Job]] = {}
        for job in self._active:
            groups.setdefault(job.request.adapters, []).append(job)
        order = list(groups)
        self._turns += 1
        for index in range(len(order)):
            adapters = order[(self._turns + index) % len(order)]
            if adapters != self._adapters:
                self._adapted.use_adapters(adapters)
                self._adapters = adapters
            yield groups[adapters]

    def _step_jobs(self, jobs: list[Job], began: float) -> bool:
        """`_step` for these requests (one adapter set); False when none has anything to decode."""
        drafts = self._drafts(jobs) if self._speculation is not None else {}
        parts: list[Part] = []
        for job in jobs:
            if job.pending_token is not None and job.slot is not None:
                draft = drafts.get(job.slot.id)
                tokens = (job.pending_token, *draft.tokens) if draft else (job.pending_token,)
                parts.append(Part(job, tokens, len(job.slot.tokens), True, draft=draft))
        # A step with drafts stays within what speculation allows (one placement with a
        # sliding window); drafts are only made when the waiting prompts fit beside them.
        limit = self._speculation.step_cap if drafts and self._speculation else self.n_batch
        budget = limit - len(parts) - sum(len(draft.tokens) for draft in drafts.values())
        generated = len(parts)
        media: list[MediaPart] = []
        failed: list[Job] = []
        for job in jobs:
            if budget <= 0:
                break
            if not job.prefilling or job.slot is None:
                continue
            prompt = job.request.prompt_tokens
            start = job.next_prompt_index
            span = job.next_span()
            if span is not None and start >= span.start:
                if job.encodings[0].error is not None:
                    failed.append(job)
                    continue
                part = self._media_part(job, budget, first=not media and len(parts) == generated)
                if part is not None:
                    media.append(part)
                    budget -= part.count
                continue
            end = len(prompt) if span is None else span.start
            end = self._stop_at_held_prefix(prompt, start, end)
            chunk = prompt[start : min(start + budget, end)]
            parts.append(Part(job, chunk, start, False, start + len(chunk) == len(prompt)))
            budget -= len(chunk)
        for job in failed:
            error = job.encodings[0].error
            assert error is not None
            self._fail(job, error)
        if not parts and not media:
            return bool(failed)
        # Counted before the step's answers go out: a listener's record of it then comes
        # after stats() shows it (kronk_testing.replay.settled waits for that).
        self._steps += 1
        if parts:
            self._step_tokens(parts, drafts, began, timed=not media)
        self._decode_media(media)
        self._record_step(parts, media)
        return True

    def _window_full(self, job: Job) -> bool:
        """The slot's window has no room for the token after the pending one."""
        assert job.slot is not None
        return len(job.slot.tokens) + 1 >= self.n_ctx_per_seq

    def _discard(self, job: Job) -> int:
        """How many tokens a context shift drops from the job's slot: half of those after
        the kept ones, as llama-server does (0: none, the generation ends at the window)."""
        keep = job.request.shift_keep
        if keep is None or job.slot is None or self._shifter is None:
            return 0
        return (len(job.slot.tokens) - keep) // 2

    def _shift(self, job: Job) -> None:
        """Context shift: keep the slot's first `shift_keep` tokens, drop half of the rest
        and move what follows back to close the gap; the generation goes on."""
        slot, keep, discard = job.slot, job.request.shift_keep, self._discard(job)
        assert slot is not None and keep is not None and self._shifter is not None
        length = len(slot.tokens)
        if not self.model.seq_remove(slot.seq_id, keep, keep + discard):
            self._reset(slot)
            self._fail(job, KronkError(f"the KV cache of slot {slot.id} could not be shifted"))
            return
        self._shifter.seq_shift(slot.seq_id, keep + discard, length, -discard)
        del slot.tokens[keep : keep + discard]
        job.shifted = True
        log.debug(
            "slot %d: context shift kept %d tokens, dropped %d, moved %d back",
            slot.id,
            keep,
            discard,
            length - keep - discard,
        )

    def _stop_at_held_prefix(self, prompt: Sequence[int], start: int, end: int) -> int:
        """Where this step's chunk of a prompt ends: at `end`, or earlier where a held
        request's prompt parts from it. The slot then holds exactly the prefix they share
        when the held request starts, and that request copies it: a slot past it by more
        than a sliding window (or a recurrent state past it) could no longer give it."""
        for held in self._held_prompts:
            shared = common_prefix(prompt, held)
            if start < shared < end:
                end = shared
        return end

    def _media_part(self, job: Job, budget: int, *, first: bool) -> MediaPart | None:
        """The job's next rows of media embeddings that fit the budget, once encoded.

        A chunk decoded whole (non-causal attention) waits for a step whose budget holds
        it, unless it is the step's first prompt work: it is then never held back.
        """
        encoding = job.encodings[0]
        if not encoding.done:
            return None
        span = encoding.span
        offset = job.next_prompt_index - span.start
        count = span.length - offset
        if not span.whole:
            count = min(count, budget)
        elif count > budget and not first:
            return None
        return MediaPart(job, encoding, offset, count)

    def _decode_media(self, media: Sequence[MediaPart]) -> None:
        """Decode media rows into their slots' sequences and record them there."""
        model = self.model
        for part in media:
            assert isinstance(model, MediaModel)
            job, slot = part.job, part.job.slot
            if job not in self._active or slot is None:
                continue
            try:
                model.decode_media(
                    part.encoding.embeddings, part.offset, part.count, part.start, slot.seq_id
                )
            except BackendLostError:
                raise
            except Exception as exc:
                self.model.seq_remove(slot.seq_id, len(slot.tokens), -1)
                self._fail(job, self._unexpected(exc, "decoding media"))
                continue
            slot.tokens.extend(job.request.prompt_tokens[part.start : part.start + part.count])
            job.next_prompt_index += part.count
            if job.next_prompt_index == part.encoding.span.end:
                job.encodings.popleft()

    def _step_tokens(
        self, parts: list[Part], drafts: dict[int, Draft], began: float, *, timed: bool
    ) -> None:
        """Decode the step's tokens, then commit and sample. `timed`: the step is these
        tokens alone, so speculation may learn from its time."""
        try:
            started = time.perf_counter()
            self._decode(parts)
            delivering = self._deliver_all() if self._overlap else 0.0
            if self._overlap:
                self.model.synchronize()
            if self._speculation is not None:
                device = time.perf_counter() - started - delivering
                self._speculation.decoded(*rows(parts), device)
        except BackendLostError:
            raise  # nothing more can run on this model: the engine stops
        except Exception as caught:
            self._deliver_all()
            exc = self._unexpected(caught, "a decode")
            # Nothing of a failed decode may stay in the KV: the slots record what is there.
            for part in parts:
                slot = part.job.slot
                if slot is not None:
                    self.model.seq_remove(slot.seq_id, len(slot.tokens), -1)
            if len(parts) == 1:
                self._fail(parts[0].job, exc)
            else:
                # Find whose tokens the model refused (a full KV for one slot): decoded
                # one job at a time, the others go on.
                for part in parts:
                    try:
                        self._decode([part])
                    except Exception as alone:
                        assert part.job.slot is not None
                        self.model.seq_remove(part.job.slot.seq_id, len(part.job.slot.tokens), -1)
                        self._fail(part.job, self._unexpected(alone, "a decode"))
                    else:
                        self._commit([part])
            return
        counted = [(part.job, part.job.completion_tokens) for part in parts if part.generated]
        self._commit(parts)
        if self._speculation is not None and timed and len(counted) == len(parts):
            # A step of generating slots alone: what it output, drafts or not, and in what time.
            output = sum(job.completion_tokens - before for job, before in counted)
            seconds = time.perf_counter() - began
            self._speculation.stepped(len(parts), bool(drafts), output, seconds)

    def _drafts(self, jobs: Sequence[Job]) -> dict[int, Draft]:
        """Draft tokens by slot id for the generating slots (speculative decoding)."""
        assert self._speculation is not None
        generating: list[Speculating] = []
        prefill = 0
        for job in jobs:
            slot = job.slot
            if slot is None:
                continue
            if job.pending_token is not None and not job.request.media:
                # Draft tokens past max_tokens or the context could never be output. (A draft
                # strategy cannot read media positions' pseudo-tokens: no drafts with media.)
                room = min(
                    job.request.max_tokens - job.completion_tokens - 1,
                    self.n_ctx_per_seq - len(slot.tokens) - 2,
                )
                item = Speculating(
                    slot, job.request_id, job.pending_token, room, job.request.sampling
                )
                generating.append(item)
            elif job.prefilling:
                prefill += len(job.request.prompt_tokens) - job.next_prompt_index
        return self._speculation.drafts(generating, prefill)

    def _decode(self, parts: Sequence[Part]) -> None:
        batch = Batch()
        for part in parts:
            assert part.job.slot is not None
            seq_id = part.job.slot.seq_id
            last = part.start + len(part.tokens) - 1
            # Rows with logits: the last token's, and every token's of a drafted part.
            first = part.start if part.draft is not None else last
            for position, token in zip(itertools.count(part.start), part.tokens, strict=False):
                index = batch.add(token, position, seq_id, part.sample and position >= first)
            part.job.batch_index = index - (last - first)
        self.model.decode(batch)

    def _commit(self, parts: Sequence[Part]) -> None:
        """The parts are in the KV: record them in their slots, then sample who can."""
        for part in parts:
            job, slot = part.job, part.job.slot
            assert slot is not None
            if part.generated:
                slot.tokens.append(part.tokens[0])  # draft tokens join once they stand
                job.pending_token = None
                if job.stopped:
                    self._stop_after_delivery(part)
            else:
                slot.tokens.extend(part.tokens)
                job.next_prompt_index += len(part.tokens)
                if part.completes:
                    job.prefilled_at = time.monotonic()
                    if not job.choice:  # a later choice's slot copied its prompt: no home
                        self._last_prompts[slot.id] = (job.request.prompt_tokens, part.start)
        for part in parts:
            if part.completes and part.job.followers:
                self._start_followers(part.job)
        for part in parts:
            if part.sample and part.job in self._active:
                try:
                    if part.draft is None:
                        self._sample(part.job)
                    else:
                        self._verify(part)
                except Exception as exc:
                    if part.draft is not None and part.job.slot is not None:
                        self._reset(part.job.slot)  # its KV may still hold draft tokens
                    self._fail(part.job, self._unexpected(exc, "sampling"))
        self._outbox.flush()
        for part in parts:
            slot = part.job.slot
            if part.completes and slot is not None:
                # After the first token went out, so the strategy's work (a checkpoint)
                # adds nothing to the time to first token; the next decode comes later.
                slot.pending = False
                try:
                    self._cache.prefilled(slot, self.model)
                except Exception as exc:
                    self._fail(part.job, self._unexpected(exc, "the cache strategy"))
                    self._reset(slot)

    def _stop_after_delivery(self, part: Part) -> None:
        """A stop string was found in the text of the token this part decoded: the request
        ends; its draft tokens, never output, leave the KV."""
        job, slot = part.job, part.job.slot
        assert slot is not None
        cut = part.draft is None or self._speculation is None or self._speculation.cut(slot)
        if not cut:
            self._reset(slot)
        self._finish(job, FinishReason.stop)

    def _unexpected(self, exc: Exception, during: str) -> KronkError:
        """A KronkError as it is; anything else is a fault (logged with its stack) that
        fails the requests it touched, while the engine goes on with the others."""
        if isinstance(exc, KronkError):
            return exc
        log.error("%s failed on %s", during, self.model.info.id, exc_info=exc)
        return KronkError(f"the inference engine failed in {during}; see the server log")

    def _fail(self, job: Job, exc: KronkError) -> None:
        if job not in self._active:
            return  # it had finished before the fault
        log.error("request %s failed on %s: %s", job.request_id, self.model.info.id, exc.message)
        self._finish(job, FinishReason.error, error=exc)

    def _reset(self, slot: Slot) -> None:
        """Empty a slot whose KV no longer matches what it records."""
        self.model.seq_remove(slot.seq_id, 0, -1)
        slot.tokens.clear()

    def _record_step(self, parts: Sequence[Part], media: Sequence[MediaPart] = ()) -> None:
        generating = {
            p.job.slot.id: len(p.tokens) for p in parts if p.generated and p.job.slot is not None
        }
        prefilling = {
            p.job.slot.id: len(p.tokens)
            for p in parts
            if not p.generated and p.job.slot is not None
        }
        prefilling.update((p.job.slot.id, p.count) for p in media if p.job.slot is not None)
        self._prefilled += sum(prefilling.values())
        if self._step_listeners:
            drafts = {
                p.job.slot.id: p.draft.tokens
                for p in parts
                if p.draft is not None and p.job.slot is not None
            }
            record = StepRecord(self._steps, generating, prefilling, drafts)
            for listener in self._step_listeners:
                try:
                    listener(record)
                except Exception:
                    log.exception("step listener failed")

    def _sample(self, job: Job) -> None:
        assert job.sampler is not None
        token = job.sampler.sample(job.batch_index)
        reason = self._emit(job, token, job.batch_index)
        if reason is None:
            job.pending_token = token
        else:
            self._finish(job, reason)

    def _verify(self, part: Part) -> None:
        """Emit the target's tokens for a drafted part; drop what it did not confirm from the KV."""
        job, slot, draft = part.job, part.job.slot, part.draft
        assert self._speculation is not None and slot is not None and draft is not None
        assert job.sampler is not None
        chosen = self._speculation.verify(slot.id, job.sampler, job.batch_index, draft)
        reason: FinishReason | None = None
        accepted = 0
        for offset, token in enumerate(chosen):
            reason = self._emit(job, token, job.batch_index + offset)
            if reason is not None:
                break
            if offset < len(chosen) - 1:
                slot.tokens.append(token)  # a draft token that stood: its KV is in place
                accepted += 1
            else:
                job.pending_token = token
        rejected = len(draft.tokens) - accepted
        job.accepted_tokens += accepted
        job.rejected_tokens += rejected
        self._speculation.settled(slot.id, accepted, rejected)
        # Draft tokens that did not become output are still in the KV behind the slot's text.
        if rejected and not self._speculation.cut(slot):
            # The KV holds tokens that never became output: nothing of it may be reused.
            self._reset(slot)
            self._speculation.disable(f"the KV of slot {slot.id} could not be cut back exactly")
            self._fail(
                job,
                KronkError(
                    "speculative decoding could not drop rejected draft tokens from the KV "
                    "cache; it is now off for this model (retry the request)"
                ),
            )
        elif reason is not None:
            self._finish(job, reason)

    def _emit(self, job: Job, token: int, batch_index: int) -> FinishReason | None:
        """Count one sampled token and hand it to the consumer (with overlap, after the next
        decode is launched); the reason it ends the request, if it does."""
        assert job.slot is not None
        if job.completion_tokens == 0:
            job.first_token_at = time.monotonic()
        if self.model.is_end_of_generation(token) or token in job.request.end_tokens:
            return FinishReason.stop
        job.completion_tokens += 1
        self._generated += 1
        logprobs: tuple[TokenLogprob, ...] = ()
        if job.request.logprobs:
            # The native chain samples from a copy, so these are the raw
            # log-probs the token was chosen from, as before acceptance.
            logprobs = (self.model.logprobs(batch_index, token, job.request.top_logprobs),)
        job.undelivered.append((token, logprobs))
        ends = job.completion_tokens >= job.request.max_tokens or (
            self._window_full(job) and self._discard(job) < 1
        )
        if self._overlap and not ends:
            if len(job.undelivered) == 1:
                self._delivering.append(job)
            return None
        if self._deliver(job):
            return FinishReason.stop
        return FinishReason.length if ends else None

    def _deliver(self, job: Job) -> bool:
        """Hand a job's counted tokens to its consumer, oldest first; True when their text
        reaches a stop string (the tokens after it are no longer counted)."""
        assert job.stops is not None
        undelivered, job.undelivered = job.undelivered, []
        for index, (token, logprobs) in enumerate(undelivered):
            piece = self.model.token_bytes(token, special=job.request.special_tokens_as_text)
            text = job.stops.push(job.utf8.push(piece))
            # Posted even when the text is held back, so every token is accounted for.
            self._outbox.post(job, TextChunk(text, 1, logprobs))
            if job.stops.matched is not None:
                # Tokens after the stop came from one verified draft: as without overlap,
                # the stop token and those after it count as rejected, not accepted.
                dropped = len(undelivered) - index - 1
                job.completion_tokens -= dropped
                self._generated -= dropped
                if dropped:
                    job.accepted_tokens -= dropped
                    job.rejected_tokens += dropped
                    if self._speculation is not None and job.slot is not None:
                        self._speculation.settled(job.slot.id, -dropped, dropped)
                return True
        return False

    def _deliver_all(self) -> float:
        """Hand over the tokens of the last step while the device decodes the next one;
        returns the seconds it took."""
        started = time.perf_counter()
        delivering, self._delivering = self._delivering, []
        for job in delivering:
            # A job that finished meanwhile had its tokens delivered then.
            if job.undelivered and self._deliver(job):
                job.stopped = True
        self._outbox.flush()
        return time.perf_counter() - started

    def _record(self, job: Job, reason: FinishReason) -> RequestRecord:
        now = time.monotonic()
        return RequestRecord(
            request_id=job.request_id,
            model=self.model.info.id,
            prompt_tokens=len(job.request.prompt_tokens),
            completion_tokens=job.completion_tokens,
            cached_tokens=job.cached_tokens,
            finish_reason=reason.value,
            queue_seconds=(job.started_at or now) - job.enqueued_at,
            time_to_first_token=(job.first_token_at - job.enqueued_at)
            if job.first_token_at
            else 0.0,
            total_seconds=now - job.enqueued_at,
            slot=job.slot.id if job.slot is not None else -1,
            enqueued_at=job.enqueued_at,
            started_at=job.started_at,
            cache_ready_at=job.cache_ready_at,
            prefilled_at=job.prefilled_at,
            first_token_at=job.first_token_at,
            finished_at=now,
        )

    def _finish(self, job: Job, reason: FinishReason, error: KronkError | None = None) -> None:
        with request_scope(job.request_id):
            self._end(job, reason, error)

    def _end(self, job: Job, reason: FinishReason, error: KronkError | None) -> None:
        if job.undelivered and reason is not FinishReason.error:
            self._deliver(job)
        if job.stops is not None and reason is not FinishReason.error:
            tail = job.stops.push(job.utf8.flush()) + job.stops.flush()
            if tail:
                self._outbox.post(job, TextChunk(tail, 0))
        usage = Usage(
            prompt_tokens=len(job.request.prompt_tokens),
            completion_tokens=job.completion_tokens,
            cached_tokens=job.cached_tokens,
            accepted_prediction_tokens=job.accepted_tokens,
            rejected_prediction_tokens=job.rejected_tokens,
        )
        matched = job.stops.matched if job.stops is not None else None
        if matched not in job.request.stop:  # the model's own end, not a requested stop
            matched = None
        record = self._record(job, reason)
        self._outbox.post(job, Finished(reason, usage, error, stop_sequence=matched, record=record))
        log.debug(
            "finished (%s): %d completion tokens, %.1f tokens/s",
            reason.value,
            job.completion_tokens,
            record.tokens_per_second,
        )
        if self._on_finished is not None:
            self._on_finished(record)
        if job.sampler is not None:
            job.sampler.close()
            job.sampler = None
        self._active.remove(job)
        if job.followers:
            self._requeue_followers(job)
        for encoding in job.encodings:
            encoding.cancelled = True
        job.encodings.clear()
        slot = job.slot
        if slot is None:
            return
        job.pending_token = None
        # Ended midway through a media chunk: no cache keeps part of an image.
        self._keep_whole_media(slot, job.request.media, len(slot.tokens))
        if job.shifted and job.request.shift_keep is not None:
            # Moved keys are not what a prefill of those tokens gives: no cache reuses them.
            self._cut(slot, job.request.shift_keep, len(slot.tokens))
        try:
            self._cache.release(slot, self.model)
        except Exception as exc:
            self._unexpected(exc, f"releasing slot {slot.id}")
            self._reset(slot)
        slot.busy = slot.pending = False
        slot.last_used = time.monotonic()
