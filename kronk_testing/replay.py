"""Replays that prove the engine exact: a cache-less context decodes exactly what the
engine decoded, in the same batches, and picks each token from its own logits.

llama.cpp's CPU kernels round differently for different batch shapes (docs/caching.md,
"Numerics"): on Gemma 3 270M one prompt prefilled in one chunk, or as chunk + single
generated tokens + chunk, differs by up to 0.9 nats with no cache at all, and where a
sequence's cells lie in the pool changes rounding too. So "the cache is exact" and
"speculation is exact" are checked against a replay of the same decode layout: every
token, its log-prob and the top log-probs within TOLERANCE nats, to the end of the answer.

`ColdReplay` replays one conversation's chunks, `BatchReplay` the engine's batches
(`step_records` collects them); a cache strategy or a draft strategy of a plugin is proved
exact the same way. The replays run on the llamacpp plugin's model, imported when one is
made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kronk_core.contract import (
    Batch,
    ChatResult,
    FinishReason,
    Greedy,
    ModelConfig,
    Sampler,
    SamplerStage,
    StepRecord,
    TokenLogprob,
)
from kronk_testing.waiting import wait_until

if TYPE_CHECKING:
    from kronk_core import Kronk
    from kronk_core.contract import Engine
    from kronk_llamacpp.model import LlamaTextModel

TOLERANCE = 0.02
GREEDY: tuple[SamplerStage, ...] = (Greedy(),)


def _llama_model(config: ModelConfig) -> LlamaTextModel:
    from kronk_llamacpp.model import LlamaTextModel

    return LlamaTextModel(config)


def prompt_of(kronk: Kronk, model: str, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """The token ids `messages` render to on the loaded `model`: the prompt a request
    decodes, for a replay's `prefill` and `start`."""
    loaded = kronk.get_loaded(model)
    assert loaded is not None
    request = kronk.chat_request(messages, model=model)
    return loaded.render(request.messages, kronk.render_options(request))


class ColdReplay:
    """A cache-less context that decodes exactly the chunks the cached slot decoded.

    So "the cache is exact" is checked against a cold run of the same decode
    layout, and greedy text against a plain one-chunk cold run.
    """

    def __init__(self, config: ModelConfig) -> None:
        self.model = _llama_model(config.model_copy(update={"n_seq_max": 1}))
        self.tokens: list[int] = []
        # Each token the last generate() sampled, with the top-5 log-probs at its position.
        self.logprobs: list[TokenLogprob] = []
        self._index = 0

    def prefill(self, prompt: list[int], keep: int) -> list[tuple[str, float]]:
        """Keep `keep` tokens of the sequence, decode the rest of prompt in one chunk."""
        assert self.tokens[:keep] == prompt[:keep]
        self.model.seq_remove(0, keep, -1)
        self.tokens = list(prompt)
        batch = Batch()
        for position in range(keep, len(prompt)):
            batch.add(prompt[position], position, 0, position == len(prompt) - 1)
        self.model.decode(batch)
        self._index = len(batch) - 1
        first = self.model.logprobs(self._index, 0, 5).top_logprobs
        return [(t.token, t.logprob) for t in first]

    def generate(self, max_tokens: int, stages: Sequence[SamplerStage] = GREEDY) -> str:
        """Sample with `stages` (greedy unless given) as the engine does for a request of
        `max_tokens`, one token per decode: up to an end-of-generation token (not text; the
        token before it was decoded to sample it) or `max_tokens` tokens (the last one is
        not decoded)."""
        sampler = self.model.new_sampler(stages)
        text = b""
        self.logprobs = []
        try:
            for produced in range(max_tokens):
                token = sampler.sample(self._index)
                if self.model.is_end_of_generation(token):
                    break
                self.logprobs.append(self.model.logprobs(self._index, token, 5))
                text += self.model.token_bytes(token)
                if produced == max_tokens - 1:
                    break
                batch = Batch()
                self._index = batch.add(token, len(self.tokens), 0, True)
                self.model.decode(batch)
                self.tokens.append(token)
        finally:
            sampler.close()
        return text.decode("utf-8", errors="replace")

    def extend(self, token: int) -> None:
        """Decode one more token after the last generate(): what the engine decodes while
        it hands out the text that then meets a stop string (overlapped decoding)."""
        batch = Batch()
        self._index = batch.add(token, len(self.tokens), 0, True)
        self.model.decode(batch)
        self.tokens.append(token)

    def move_cells(self) -> None:
        """Export the sequence and import it again, as a restore from the host tier does:
        its cells then lie where a restored state's lie (which changes rounding)."""
        state = self.model.seq_state(0)
        self.model.seq_remove(0, 0, -1)
        assert self.model.set_seq_state(0, state) > 0

    def close(self) -> None:
        self.model.close()


@dataclass
class Start:
    """A request BatchReplay replays: its prompt, its result, the slot it copied its cached
    tokens from (None: they were its own slot's), and the sampler stages it picks with."""

    prompt: Sequence[int]
    result: ChatResult
    donor: int | None = None
    stages: Sequence[SamplerStage] = GREEDY


class BatchReplay:
    """A cache-less context shaped like the engine's (same slots, same KV layout) that
    decodes the batches the engine's steps decoded, built from each request's own prompt and
    its own picks. Sequences decoded in one batch round differently than alone (up to ~1 nat
    on Gemma), and where a sequence's cells lie in the pool changes rounding too (a prefix
    copied from another slot: up to 0.4 nats on SmolLM2 against one sequence cut back; the
    cells a slot without a cache frees as its request ends, taken by the other slots' next
    tokens: 0.07 nats), so requests that ran at once, or copied a prefix, are checked
    against this.

    Speculative decoding: where a step carried draft tokens behind a slot's token, the
    replay decodes the same draft tokens at the same positions, each with its logits, and
    verifies them as greedy decoding defines it: a draft token stands only if the slot's
    chain, picking from the row before it, picks that very token; the first pick that
    differs is the slot's next token, and the draft tokens after it leave the KV again.
    """

    def __init__(self, config: ModelConfig) -> None:
        self.model = _llama_model(config)
        # Without a cache a slot's sequence is emptied as its request ends.
        self._empties = config.cache == "none"
        self.tokens: dict[int, list[int]] = {}
        # Per slot, the request now replayed: its prompt, how far it is prefilled, the token
        # to decode next, its sampler chain, how many tokens it may still pick (None: no
        # end but an end of generation); what it picked (each token with the top-5 log-probs
        # at its position, and the text).
        self._prompt: dict[int, Sequence[int]] = {}
        self._prefilled: dict[int, int] = {}
        self._pending: dict[int, int] = {}
        self._samplers: dict[int, Sampler] = {}
        self._left: dict[int, int | None] = {}
        self.logprobs: dict[int, list[TokenLogprob]] = {}
        self.text: dict[int, bytes] = {}

    def start(
        self,
        slot: int,
        prompt: Sequence[int],
        keep: int,
        donor: int | None = None,
        stages: Sequence[SamplerStage] = GREEDY,
        max_tokens: int | None = None,
    ) -> None:
        """A request starts in `slot`: its sequence keeps `keep` tokens of its own, or holds
        the first `keep` of slot `donor`'s, copied as the engine copies a shared prefix. It
        picks with `stages` and ends after `max_tokens` tokens, if given."""
        tokens = self.tokens.setdefault(slot, [])
        if donor is None:
            self.model.seq_remove(slot, keep, -1)
            del tokens[keep:]
        else:
            self.model.seq_remove(slot, 0, -1)
            self.model.seq_copy(donor, slot, 0, keep)
            tokens[:] = self.tokens[donor][:keep]
        assert tokens == list(prompt[:keep])
        self._prompt[slot], self._prefilled[slot] = prompt, keep
        self._pending.pop(slot, None)
        if slot in self._samplers:
            self._samplers.pop(slot).close()
        self._samplers[slot] = self.model.new_sampler(stages)
        self._left[slot] = max_tokens
        self.logprobs[slot], self.text[slot] = [], b""

    def ended(self, slot: int) -> bool:
        """Whether the request last started in `slot` has ended."""
        prompt = self._prompt.get(slot)
        return (
            prompt is not None
            and self._prefilled[slot] == len(prompt)
            and slot not in self._pending
        )

    def step(self, record: StepRecord) -> None:
        """Decode what this engine step decoded, in the same order; pick, and verify drafts."""
        batch = Batch()
        picking: list[tuple[int, list[int], tuple[int, ...]]] = []  # slot, rows, draft
        for slot, count in record.generating.items():
            draft = record.drafts.get(slot, ())
            assert count == 1 + len(draft), (slot, count, draft)
            start = len(self.tokens[slot])
            decoded = (self._pending.pop(slot), *draft)
            rows = [batch.add(t, start + i, slot, True) for i, t in enumerate(decoded)]
            self.tokens[slot].extend(decoded)  # draft tokens that do not stand leave below
            picking.append((slot, rows, draft))
        for slot, count in record.prefilling.items():
            prompt, start = self._prompt[slot], self._prefilled[slot]
            end = start + count
            for position in range(start, end):
                last = end == len(prompt) and position == end - 1
                index = batch.add(prompt[position], position, slot, last)
            if end == len(prompt):
                picking.append((slot, [index], ()))
            self.tokens[slot].extend(prompt[start:end])
            self._prefilled[slot] = end
        self.model.decode(batch)
        for slot, rows, draft in picking:
            self._pick(slot, rows, draft)

    def _pick(self, slot: int, rows: list[int], draft: tuple[int, ...]) -> None:
        """The slot's tokens from `rows`: the draft's while the chain picks them, then the
        chain's own. An end-of-generation token, or the last token max_tokens allows, ends
        the request."""
        sampler = self._samplers[slot]
        picks: list[int] = []
        for offset, row in enumerate(rows):
            picks.append(sampler.sample(row))
            if offset == len(draft) or picks[-1] != draft[offset]:
                break
        emitted = 0
        for token, row in zip(picks, rows, strict=False):
            if self.model.is_end_of_generation(token):
                break
            self.logprobs[slot].append(self.model.logprobs(row, token, 5))
            self.text[slot] += self.model.token_bytes(token)
            emitted += 1
        # In the KV: the draft tokens that stood and were output before the last token,
        # which is decoded next step (unless the request ends).
        stood = min(emitted, len(picks) - 1)
        if stood < len(draft):
            del self.tokens[slot][len(self.tokens[slot]) - len(draft) + stood :]
            cut = self.model.seq_remove(slot, len(self.tokens[slot]), -1)
            assert cut, f"slot {slot}: the rejected draft tokens could not be cut"
        left = self._left[slot]
        if left is not None:
            # The engine drafts no more than max_tokens leaves room for.
            left = self._left[slot] = left - emitted
            assert left >= 0, f"slot {slot}: past max_tokens"
        if emitted == len(picks) and left != 0:
            self._pending[slot] = picks[-1]
        elif self._empties:
            self.model.seq_remove(slot, 0, -1)
            self.tokens[slot].clear()

    async def check(self, records: Sequence[StepRecord], requests: dict[int, Start]) -> None:
        """Decode the engine's steps, each request (by its slot) starting right before its
        slot's first prefill, where the engine admitted it, keeping what the cache said,
        until every request has ended; then every answer and log-prob is the replay's.

        A request ends where its replay picks an end of generation, or where the engine
        cut it at max_tokens (a replay that picked other tokens then differs). The engine
        reports a step after it handed out the answers the step finished, so the last
        records may still be on their way: where none comes (the replay picked fewer
        tokens than the engine), the comparison shows where they part.
        """
        starts = dict(requests)
        done = 0
        while starts or not all(self.ended(slot) for slot in requests):
            if done == len(records):

                def more(seen: int = done) -> bool:
                    return len(records) > seen

                try:
                    await wait_until(more)
                except AssertionError:
                    break
            for record in records[done:]:
                for slot in record.prefilling:
                    if slot in starts:
                        self._begin(slot, starts.pop(slot))
                self.step(record)
                done += 1
        assert not starts, f"slots {sorted(starts)} never prefilled"
        for slot, request in requests.items():
            assert_same_logprobs(request.result, self.logprobs[slot])
            # As the engine streams text: bytes that are not UTF-8 become U+FFFD.
            assert self.text[slot].decode(errors="replace") == request.result.content

    def _begin(self, slot: int, request: Start) -> None:
        result = request.result
        cut = result.finish_reason is FinishReason.length
        max_tokens = result.usage.completion_tokens if cut else None
        keep = result.usage.cached_tokens
        self.start(slot, request.prompt, keep, request.donor, request.stages, max_tokens)

    def close(self) -> None:
        for sampler in self._samplers.values():
            sampler.close()
        self.model.close()


def step_records(engine: Engine) -> list[StepRecord]:
    """The records of the engine's steps from now on, for as long as it runs (it reports a
    step after handing out the answers the step finished: BatchReplay.check waits)."""
    records: list[StepRecord] = []
    engine.add_step_listener(records.append)
    return records


def assert_same_first_token(
    result: ChatResult, reference: list[tuple[str, float]], tolerance: float = TOLERANCE
) -> None:
    """The first token's top-5 log-probs are the reference's (within `tolerance` nats)."""
    ours = {t.token: t.logprob for t in result.logprobs[0].top_logprobs}
    theirs = dict(reference)
    best = max(ours, key=lambda token: ours[token])
    assert best == max(theirs, key=lambda token: theirs[token])
    for token in ours.keys() & theirs.keys():
        assert abs(ours[token] - theirs[token]) < tolerance, (ours, theirs)
    if tolerance <= TOLERANCE:
        assert list(ours) == [token for token, _ in reference]


def assert_same_logprobs(
    result: ChatResult,
    replay: ColdReplay | list[TokenLogprob],
    tolerance: float = TOLERANCE,
) -> None:
    """Every generated token is the replay's, with its log-prob and the top log-probs the
    answer carries (up to 5) within `tolerance` nats, to the end of the answer."""
    expected = replay.logprobs if isinstance(replay, ColdReplay) else replay
    for position, (ours, theirs) in enumerate(zip(result.logprobs, expected, strict=False)):
        assert ours.bytes == theirs.bytes, (position, ours, theirs)
        assert abs(ours.logprob - theirs.logprob) < tolerance, (position, ours, theirs)
        mine = {t.bytes: t.logprob for t in ours.top_logprobs}
        other = {t.bytes: t.logprob for t in theirs.top_logprobs}
        if mine:
            assert max(mine, key=lambda token: mine[token]) == theirs.top_logprobs[0].bytes
        for token in mine.keys() & other.keys():
            assert abs(mine[token] - other[token]) < tolerance, (position, mine, other)
    lengths = (len(result.logprobs), len(expected), result.usage.completion_tokens)
    assert lengths[0] == lengths[1] == lengths[2], lengths
