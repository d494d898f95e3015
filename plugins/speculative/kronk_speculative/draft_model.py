"""The `draft` strategy: a second, smaller model with the same vocabulary proposes tokens.

The draft model gets one KV sequence per target slot. Before drafting, a
sequence is brought in step with its slot's context by keeping the longest
prefix it (or, when the slot's conversation moved, another sequence) already
holds and decoding only the rest: a prefix the target reuses from its cache is
reused here too. Then all drafting slots draft together, one decode per token.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import BaseModel

from kronk_core.contract import (
    Batch,
    ConfigError,
    Distribution,
    Draft,
    DraftRequest,
    Greedy,
    KronkError,
    KronkView,
    ModelConfig,
    ModelLoadError,
    Sampler,
    SamplerStage,
    SamplingParams,
    StrategyModel,
    Temperature,
    TextModel,
    TokenDistribution,
    backend_for,
    common_prefix,
    draw,
    model_config_for,
    truncation_stages,
)
from kronk_speculative.settings import SpeculativeSettings
from kronk_speculative.vocab import check_vocabulary

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

# The backend section the manual's ngpu-layers and device keys go to.
_BACKEND_SECTION = "llamacpp"
# Copy a prefix from another sequence only when it saves at least this many tokens.
_COPY_MIN_TOKENS = 32
# A cut this close to the trim floor only misses window positions at the window's far
# edge: the draft's guesses barely change, and decoding the whole context again would
# cost far more. (The target's own cuts are always exact.)
_ROLLBACK_SLACK = 32
# A draft's distributions are kept only while top-k keeps them this small.
_SUPPORT_LIMIT = 512


def load_draft_model(
    kronk: KronkView,
    model_config: ModelConfig,
    target: StrategyModel,
    settings: SpeculativeSettings,
) -> StrategyModel:
    """The draft model for `target`: one sequence per target slot, the same context length.

    Its own model config is used (what `kronk model show` would load), with the
    manual's `ngpu-layers` and `device` applied on top. Sliding-window layers
    keep their whole context (`swa_full`) so that rejected drafts can be cut
    back exactly.
    """
    key = f"{model_config.section_key('speculative')}.model_id"
    model_id = settings.model_id
    if model_id is None:
        raise ConfigError(key, "the draft strategy needs a draft model: set model_id (model-id)")
    try:
        base = model_config_for(kronk, model_id)
    except KronkError as exc:
        raise ConfigError(key, f"draft model {model_id!r}: {exc.message}") from None
    info = target.info
    config = base.model_copy(
        update={
            "n_seq_max": info.n_seq_max,
            "context_window": info.n_ctx_per_seq,
            "n_batch": model_config.n_batch,
            "draft_strategy": "none",
            "sections": _backend_sections(base, settings, key),
        }
    )
    try:
        _, backend = backend_for(kronk, config)
    except ConfigError as exc:
        raise ConfigError(key, f"draft model {model_id!r}: {exc.message}") from None
    try:
        draft = backend.load_model(config)
    except KronkError as exc:
        raise ModelLoadError(f"{key}: could not load the draft model: {exc.message}") from None
    try:
        if not isinstance(draft, TextModel):
            raise ConfigError(key, f"{model_id!r} is an embedding model, not a text model")
        if not draft.info.kv_trimmable:
            raise ConfigError(
                key, f"{model_id!r} keeps state that cannot be cut back (recurrent layers)"
            )
        check_vocabulary(target, draft, key)
    except BaseException:
        draft.close()
        raise
    return draft


def _backend_sections(
    base: ModelConfig, settings: SpeculativeSettings, key: str
) -> dict[str, object]:
    sections = dict(base.sections)
    backend = sections.get(_BACKEND_SECTION)
    if not isinstance(backend, BaseModel):
        if settings.n_gpu_layers is not None or settings.device is not None:
            raise ConfigError(key, "ngpu-layers and device need the llamacpp backend")
        return sections
    overrides: dict[str, object] = {"swa_full": True}
    if settings.n_gpu_layers is not None:
        overrides["n_gpu_layers"] = settings.n_gpu_layers
    if settings.device is not None:
        overrides.update(device=settings.device, tensor_split=None)
    sections[_BACKEND_SECTION] = backend.model_validate({**backend.model_dump(), **overrides})
    return sections


def draft_stages(params: SamplingParams) -> list[SamplerStage]:
    """The draft's own distribution q for a sampled request: the target's truncation and
    temperature, without the stateful stages (any q keeps the output exact)."""
    return [*truncation_stages(params), Temperature(params.temperature), Distribution(0)]


@dataclass(slots=True)
class _Drafting:
    """One request's draft in progress."""

    request: DraftRequest
    sampler: Sampler
    stochastic: bool
    tokens: list[int] = field(default_factory=list)
    distributions: list[TokenDistribution] = field(default_factory=list)
    row: int = -1
    done: bool = False

    def pick(self) -> None:
        """The next draft token from the logits at `row`."""
        if not self.stochastic:
            self.tokens.append(self.sampler.sample(self.row))
        else:
            q = self.sampler.distribution(self.row, _SUPPORT_LIMIT)
            if q is None:
                self.done = True
                return
            weights = tuple(zip(q.tokens, q.probs, strict=True))
            self.tokens.append(draw(weights, self.request.random))
            self.distributions.append(q)
        self.done = len(self.tokens) >= self.request.max_tokens


class DraftModel:
    """The `draft` strategy over a loaded draft model; it owns the model and closes it."""

    name = "draft"
    # Its drafts cost a decode each, and they follow from how its sequences' KV was built,
    # which earlier requests decide (prefixes kept and copied): when to draft stays measured.
    reproducible = False

    def __init__(
        self, model: TextModel, *, ndraft: int, n_batch: int, adaptive: bool = True
    ) -> None:
        self.ndraft = ndraft
        self.adaptive = adaptive
        self._model = model
        self._n_batch = n_batch
        # What each of the draft model's sequences holds (sequence i follows target slot i).
        self._records: list[list[int]] = [[] for _ in range(model.info.n_seq_max)]
        self._greedy = model.new_sampler([Greedy()])
        # Context tokens decoded to bring sequences in step with their slots (what the draft
        # could not reuse), and prefixes copied between its sequences.
        self.prefilled_tokens = 0
        self.copied_prefixes = 0

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        drafting = [self._start(request) for request in requests]
        try:
            self._catch_up(drafting)
            while True:
                active = [item for item in drafting if not item.done]
                if not active:
                    break
                batch = Batch()
                for item in active:
                    record = self._records[item.request.slot_id]
                    item.row = batch.add(item.tokens[-1], len(record), item.request.slot_id, True)
                    record.append(item.tokens[-1])
                self._model.decode(batch)
                for item in active:
                    item.pick()
        except KronkError as exc:
            log.warning("draft model %s failed (%s); no draft this step", self._model.info.id, exc)
            for item in drafting:
                self._forget(item.request.slot_id)
            return [Draft() for _ in requests]
        finally:
            for item in drafting:
                if item.sampler is not self._greedy:
                    item.sampler.close()
        return [Draft(tuple(item.tokens), tuple(item.distributions)) for item in drafting]

    def _start(self, request: DraftRequest) -> _Drafting:
        self._sync(request)
        if request.sampling.greedy:
            return _Drafting(request, self._greedy, stochastic=False)
        sampler = self._model.new_sampler(draft_stages(request.sampling))
        return _Drafting(request, sampler, stochastic=True)

    def _sync(self, request: DraftRequest) -> None:
        """Make the slot's sequence hold the longest prefix of the context available, at most
        all but its last token (whose logits give the first draft token)."""
        seq = request.slot_id
        context = request.context
        record = self._records[seq]
        limit = len(context) - 1
        keep = self._usable(seq, min(common_prefix(record, context), limit))
        if keep + _COPY_MIN_TOKENS < limit:
            donor, shared = max(
                (
                    (other, self._usable(other, common_prefix(self._records[other], context)))
                    for other in range(len(self._records))
                    if other != seq
                ),
                key=lambda pair: pair[1],
                default=(seq, 0),
            )
            shared = min(shared, limit)
            if shared >= keep + _COPY_MIN_TOKENS:
                self._model.seq_remove(seq, 0, -1)
                self._model.seq_copy(donor, seq, 0, shared)
                record[:] = context[:shared]
                self.copied_prefixes += 1
                return
        if keep < len(record):
            self._model.seq_remove(seq, keep, -1)
            del record[keep:]

    def _usable(self, seq: int, shared: int) -> int:
        """How much of a sequence's first `shared` tokens can be kept: all of them unless a
        cut there would miss window cells llama.cpp reused, then none."""
        if shared == len(self._records[seq]):
            return shared
        return shared if shared + _ROLLBACK_SLACK >= self._model.trim_floor(seq) else 0

    def _catch_up(self, drafting: Sequence[_Drafting]) -> None:
        """Decode what each sequence lacks of its context, n_batch tokens at a time; the first
        draft token comes from each context's last token."""
        waiting = [item for item in drafting if not item.done]
        batch = Batch()
        placed: list[_Drafting] = []
        for item in waiting:
            record = self._records[item.request.slot_id]
            context = item.request.context
            for position in range(len(record), len(context)):
                if len(batch) == self._n_batch:
                    self._decode_and_pick(batch, placed)
                    batch, placed = Batch(), []
                last = position == len(context) - 1
                row = batch.add(context[position], position, item.request.slot_id, last)
                record.append(context[position])
                self.prefilled_tokens += 1
                if last:
                    item.row = row
                    placed.append(item)
        if len(batch):
            self._decode_and_pick(batch, placed)

    def _decode_and_pick(self, batch: Batch, placed: Sequence[_Drafting]) -> None:
        self._model.decode(batch)
        for item in placed:
            item.pick()

    def _forget(self, seq: int) -> None:
        self._model.seq_remove(seq, 0, -1)
        self._records[seq].clear()

    def close(self) -> None:
        self._greedy.close()
        self._model.close()
