"""Sampler stages → one native llama.cpp sampler chain."""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import cast

import llama_cpp
import numpy as np

from kronk_core.contract import (
    SELECTING_STAGES,
    AdaptiveP,
    CompiledGrammar,
    Distribution,
    Dry,
    Grammar,
    Greedy,
    InvalidRequestError,
    JsonSchemaGrammar,
    LogitBias,
    MinP,
    Mirostat,
    MirostatV2,
    Penalties,
    SamplerStage,
    StructuredGrammar,
    Temperature,
    TokenDistribution,
    TopK,
    TopP,
    TypicalP,
    Xtc,
)
from kronk_llamacpp.grammar_compiler import GrammarCompiler

# llama_token_data as numpy sees it: {int32 id; float logit; float p}.
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class NativeSampler:
    """A llama.cpp sampler chain; `sample` picks from batch logits and accepts the token.

    `draws`: the chain ends in a plain random draw (`Distribution`), so the
    distribution it draws from can be given (`distribution`).
    """

    def __init__(
        self,
        ctx: llama_cpp.llama_context_p,
        chain: llama_cpp.llama_sampler_p,
        n_vocab: int,
        draws: bool = False,
    ) -> None:
        self._ctx = ctx
        self._chain: llama_cpp.llama_sampler_p | None = chain
        self._n_vocab = n_vocab
        self._draws = draws

    def sample(self, batch_index: int) -> int:
        return int(llama_cpp.llama_sampler_sample(self._chain, self._ctx, batch_index))

    def distribution(self, batch_index: int, limit: int) -> TokenDistribution | None:
        """Every stage but the final draw applied to the logits, then their softmax (as
        llama.cpp's dist sampler computes it before drawing)."""
        if not self._draws:
            return None
        pointer = llama_cpp.llama_get_logits_ith(self._ctx, batch_index)
        logits = np.ctypeslib.as_array(pointer, shape=(self._n_vocab,))
        data, candidates = _candidates(np.arange(self._n_vocab, dtype=np.int32), logits)
        for index in range(llama_cpp.llama_sampler_chain_n(self._chain) - 1):
            stage = llama_cpp.llama_sampler_chain_get(self._chain, index)
            llama_cpp.llama_sampler_apply(stage, ctypes.byref(candidates))
        kept = data[: candidates.size]
        logits = kept["logit"].astype(np.float64)
        finite = np.isfinite(logits)
        if int(finite.sum()) > limit or not finite.any():
            return None
        ids, logits = kept["id"][finite], logits[finite]
        weights = np.exp(logits - logits.max())
        probs = weights / weights.sum()
        return TokenDistribution(tuple(int(t) for t in ids), tuple(float(p) for p in probs))

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self._chain, token)

    def close(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None


class GreedySampler:
    """Greedy alone: the argmax of the logits, read in place.

    llama.cpp's sampler first copies every logit into a candidate array (about 0.3 ms
    for a 128k vocabulary), per slot and step: more than a GPU's whole decode step once
    a few dozen slots generate. numpy's argmax picks the same token (the first of equal
    maxima, as llama.cpp's greedy stage does) without the copy.
    """

    def __init__(self, ctx: llama_cpp.llama_context_p, n_vocab: int) -> None:
        self._ctx = ctx
        self._n_vocab = n_vocab

    def sample(self, batch_index: int) -> int:
        pointer = llama_cpp.llama_get_logits_ith(self._ctx, batch_index)
        return int(np.ctypeslib.as_array(pointer, shape=(self._n_vocab,)).argmax())

    def distribution(self, batch_index: int, limit: int) -> TokenDistribution | None:
        return None  # greedy draws nothing: a draft stands where it is the argmax

    def accept(self, token: int) -> None:
        pass  # greedy alone keeps no state

    def close(self) -> None:
        pass


class DeviceGreedySampler(GreedySampler):
    """Greedy on the device: a greedy chain attached to the slot's sequence takes the
    argmax inside the decode's graph, so only the token id comes back instead of a logit
    row (512 KB for a 128k vocabulary, per slot and step)."""

    def sample(self, batch_index: int) -> int:
        token = int(llama_cpp.llama_get_sampled_token_ith(self._ctx, batch_index))
        if token < 0:  # the row was not sampled on the device: its logits came back
            return super().sample(batch_index)
        return token


class DeviceGreedySamplers:
    """The greedy chains attached to sequences of one context (`llama_set_sampler`).

    Attaching or detaching makes llama.cpp rebuild its graph reservation, so a chain
    stays attached while greedy requests keep using its sequence, and goes when a
    request there needs the host's logits (another chain, log-probs).
    """

    def __init__(self, ctx: llama_cpp.llama_context_p, n_vocab: int) -> None:
        self._ctx = ctx
        self._n_vocab = n_vocab
        self._attached: dict[int, llama_cpp.llama_sampler_p] = {}
        self._set_sampler = _set_sampler_function()
        self.enabled = True

    def bind(self, seq_id: int, greedy: bool) -> DeviceGreedySampler | None:
        """A device sampler for a greedy request in seq_id; None (and seq_id detached)
        when the request samples on the host."""
        if greedy and self.enabled:
            if seq_id in self._attached:
                return DeviceGreedySampler(self._ctx, self._n_vocab)
            chain = llama_cpp.llama_sampler_chain_init(
                llama_cpp.llama_sampler_chain_default_params()
            )
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
            if self._set_sampler(self._ctx, seq_id, chain):
                self._attached[seq_id] = chain
                return DeviceGreedySampler(self._ctx, self._n_vocab)
            # This backend cannot run it (llama.cpp logs why): sample on the host.
            self._set_sampler(self._ctx, seq_id, None)
            llama_cpp.llama_sampler_free(chain)
            self.enabled = False
            return None
        self._detach(seq_id)
        return None

    def _detach(self, seq_id: int) -> None:
        chain = self._attached.pop(seq_id, None)
        if chain is not None:
            self._set_sampler(self._ctx, seq_id, None)
            llama_cpp.llama_sampler_free(chain)

    def close(self) -> None:
        for seq_id in list(self._attached):
            self._detach(seq_id)


def _set_sampler_function() -> Callable[[object, int, object], bool]:
    """`llama_set_sampler(ctx, seq_id, chain or None)`, which llama-cpp-python does not bind."""
    import llama_cpp.llama_cpp as bindings

    function = bindings._lib.llama_set_sampler
    function.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p]
    function.restype = ctypes.c_bool
    return cast(Callable[[object, int, object], bool], function)


class ShortlistGreedySampler(NativeSampler):
    """Greedy behind stages that only ever lower logits (a grammar, DRY, penalties that
    do not reward repeats): the chain runs on the tokens near the maximum only.

    The full chain copies every logit into a candidate array and DRY looks each one up
    in a map (0.33 ms per slot and step on Gemma's 262k vocabulary on two CPU cores,
    against 0.10 ms here; llama-server runs no DRY by default). A token left out starts
    below `floor` and can only go down, so when the chain's pick on the shortlist still
    scores at least `floor` it is the pick of the whole vocabulary, ties included (the
    shortlist keeps vocabulary order, and greedy takes the first of equal maxima).

    Before any shortlist, the tokens go through the chain one at a time, best first
    (`_best_first`): most steps are decided by the first token or two (the stages leave
    the maximum be, or a ban on end tokens demotes it), without the pass that finds the
    tokens within MARGIN, which on a flat step (SmolLM2 after an unusual prompt: 36,000
    of 49,152 tokens within 10 nats) cost 0.12-0.14 ms. Then the MARGIN shortlist, then
    the whole vocabulary.
    """

    MARGIN = 10.0  # nats below the maximum: a few dozen tokens on a confident step
    LOOKS = 8  # tokens tried one at a time before the MARGIN shortlist

    def __init__(
        self, ctx: llama_cpp.llama_context_p, chain: llama_cpp.llama_sampler_p, n_vocab: int
    ) -> None:
        super().__init__(ctx, chain, n_vocab)
        self._one, self._one_array = _candidates(np.zeros(1, np.int32), np.zeros(1, np.float32))

    def sample(self, batch_index: int) -> int:
        pointer = llama_cpp.llama_get_logits_ith(self._ctx, batch_index)
        logits = np.ctypeslib.as_array(pointer, shape=(self._n_vocab,))
        token = self._best_first(logits)
        if token is None:
            floor = logits.max() - self.MARGIN
            token = self._pick(np.flatnonzero(logits >= floor).astype(np.int32), logits, floor)
        if token is None:
            return self._sample_whole_vocabulary(batch_index)
        self.accept(token)
        return token

    def _best_first(self, logits: np.ndarray) -> int | None:
        """The tokens one at a time, best first, each scored by the chain: once the best
        score exceeds every token not yet tried (their logits can only go down), its token
        is the pick (of equal scores, the first in vocabulary order). None after LOOKS
        tokens. The tried tokens' logits are set aside in place meanwhile (llama.cpp's
        buffer: log-probs read it later), and restored."""
        best_token, best_score = -1, -np.inf
        tried: list[tuple[int, float]] = []
        token = int(logits.argmax())
        try:
            for _ in range(self.LOOKS):
                raw = float(logits[token])
                score = self._score(token, raw)
                if score > best_score or (score == best_score and token < best_token):
                    best_token, best_score = token, score
                tried.append((token, raw))
                logits[token] = -np.inf
                token = int(logits.argmax())  # the next to try, and the best left untried
                if best_score > logits[token]:
                    return best_token
        finally:
            for token, raw in tried:
                logits[token] = raw
        return None

    def _score(self, token: int, logit: float) -> float:
        """The token's logit after the chain's stages."""
        one, array = self._one, self._one_array
        one["id"], one["logit"] = token, logit
        array.size, array.selected, array.sorted = 1, -1, False
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(array))
        return float(one["logit"][0]) if array.size == 1 else -np.inf

    def _pick(self, shortlist: np.ndarray, logits: np.ndarray, floor: float) -> int | None:
        """The chain's pick on the shortlist if it still scores `floor`, else None."""
        if not len(shortlist):
            return None
        data, candidates = _candidates(shortlist, logits[shortlist])
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(candidates))
        picked = data[candidates.selected]
        return int(picked["id"]) if picked["logit"] >= floor else None

    def _sample_whole_vocabulary(self, batch_index: int) -> int:
        return super().sample(batch_index)


class ShortlistTopKSampler(NativeSampler):
    """A random draw behind top-k, with only stages that lower logits before top-k (a
    grammar, DRY, penalties that do not reward repeats): the chain runs on the tokens
    near the maximum only.

    The full chain fills a candidate array with every logit, lets DRY look each one up,
    and sorts the whole vocabulary for top-k: about 1.5 ms per slot and step on Gemma's
    262k vocabulary on two CPU cores, a sixth of an 8-stream decode step at the default
    temperature. Here only tokens within `margin` nats of the maximum are candidates. A
    token left out starts below `floor` and can only go down, so when at least k
    candidates still score `floor` or more after the stages before top-k, top-k keeps
    the same k tokens with the same logits as on the whole vocabulary, and every later
    stage (top-p, min-p, XTC, temperature, the draw) sees what it would have seen; the
    draw then takes the same random number. Otherwise a wider margin is tried, then the
    whole vocabulary.
    """

    MARGINS = (10.0, 20.0)

    def __init__(
        self,
        ctx: llama_cpp.llama_context_p,
        chain: llama_cpp.llama_sampler_p,
        n_vocab: int,
        top_k: int,
        before_top_k: int,
    ) -> None:
        super().__init__(ctx, chain, n_vocab, draws=True)
        self._top_k = top_k
        self._before_top_k = before_top_k
        self._stages: list[llama_cpp.llama_sampler_p] = []  # the chain's, read once filled

    def sample(self, batch_index: int) -> int:
        pointer = llama_cpp.llama_get_logits_ith(self._ctx, batch_index)
        logits = np.ctypeslib.as_array(pointer, shape=(self._n_vocab,))
        top = logits.max()
        if not self._stages:
            self._stages = [
                llama_cpp.llama_sampler_chain_get(self._chain, index)
                for index in range(llama_cpp.llama_sampler_chain_n(self._chain))
            ]
        stages = self._stages
        for margin in self.MARGINS:
            floor = top - margin
            shortlist = np.flatnonzero(logits >= floor).astype(np.int32)
            if len(shortlist) < self._top_k:
                continue
            data, candidates = _candidates(shortlist, logits[shortlist])
            # The stages before top-k keep no state between calls and draw nothing.
            for stage in stages[: self._before_top_k]:
                llama_cpp.llama_sampler_apply(stage, ctypes.byref(candidates))
            if np.count_nonzero(data["logit"][: candidates.size] >= floor) < self._top_k:
                continue
            for stage in stages[self._before_top_k :]:
                llama_cpp.llama_sampler_apply(stage, ctypes.byref(candidates))
            # Through the array's own pointer: XTC moves it past the tokens it cuts.
            token = int(candidates.data[candidates.selected].id)
            self.accept(token)
            return token
        return self._sample_whole_vocabulary(batch_index)

    def _sample_whole_vocabulary(self, batch_index: int) -> int:
        return super().sample(batch_index)


def _candidates(
    ids: np.ndarray, logits: np.ndarray
) -> tuple[np.ndarray, llama_cpp.llama_token_data_array]:
    """llama.cpp's candidate array over `ids` with their logits, and the numpy view of it."""
    data = np.empty(len(ids), dtype=_TOKEN_DATA)
    data["id"] = ids
    data["logit"] = logits
    data["p"] = 0.0
    pointer = data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data))
    return data, llama_cpp.llama_token_data_array(pointer, len(ids), -1, False)


SHORTLIST_MAX_BIASES = 256


def _only_lowers(stage: SamplerStage) -> bool:
    """The stage never raises a logit (so a token below the shortlist stays below it)."""
    match stage:
        case Grammar() | JsonSchemaGrammar() | StructuredGrammar() | CompiledGrammar() | Dry():
            return True
        case Penalties(repeat=repeat, frequency=frequency, presence=presence):
            return repeat >= 1.0 and frequency >= 0.0 and presence >= 0.0
        case LogitBias(biases=biases):
            return all(bias <= 0.0 for _, bias in biases)
    return False


def _top_k_behind_lowering_stages(stages: Sequence[SamplerStage]) -> tuple[int, int] | None:
    """Where a top-k stage with only logit-lowering stages before it is, and its k."""
    for index, stage in enumerate(stages):
        if isinstance(stage, TopK) and stage.k > 0:
            return index, stage.k
        if not _only_lowers(stage):
            return None
    return None


class DryPrototypes:
    """DRY samplers built once per parameter set and cloned per request.

    Building one scans the whole vocabulary for the sequence breakers (about
    0.1 s on Gemma's 262k tokens: paid on every request's time to first
    token); a clone copies the scan's result in microseconds.
    """

    _MAX_ENTRIES = 16

    def __init__(self, vocab: llama_cpp.llama_vocab_p) -> None:
        self._vocab = vocab
        self._prototypes: OrderedDict[tuple[object, ...], llama_cpp.llama_sampler_p] = OrderedDict()

    def clone(self, stage: Dry, last_n: int) -> llama_cpp.llama_sampler_p:
        key = (stage.multiplier, stage.base, stage.allowed_length, last_n, stage.sequence_breakers)
        prototype = self._prototypes.get(key)
        if prototype is None:
            breakers = (ctypes.c_char_p * len(stage.sequence_breakers))(
                *(b.encode() for b in stage.sequence_breakers)
            )
            prototype = llama_cpp.llama_sampler_init_dry(
                self._vocab,
                stage.multiplier,
                stage.base,
                stage.allowed_length,
                last_n,
                breakers,
                len(stage.sequence_breakers),
            )
            self._prototypes[key] = prototype
            while len(self._prototypes) > self._MAX_ENTRIES:
                llama_cpp.llama_sampler_free(self._prototypes.popitem(last=False)[1])
        self._prototypes.move_to_end(key)
        return llama_cpp.llama_sampler_clone(prototype)

    def close(self) -> None:
        while self._prototypes:
            llama_cpp.llama_sampler_free(self._prototypes.popitem()[1])


def _native_stage(
    stage: SamplerStage,
    n_vocab: int,
    n_ctx: int,
    dry: DryPrototypes,
    grammars: GrammarCompiler,
) -> llama_cpp.llama_sampler_p:
    match stage:
        case LogitBias(biases=biases):
            entries = (llama_cpp.llama_logit_bias * len(biases))(
                *(llama_cpp.llama_logit_bias(token, bias) for token, bias in biases)
            )
            return llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(biases), entries)
        case CompiledGrammar():
            return grammars.clone(stage)
        case Grammar() | JsonSchemaGrammar() | StructuredGrammar():
            # Not compiled ahead (the SDK does): compiled here, on the engine thread.
            return grammars.clone(grammars.compile(stage))
        case Penalties(last_n=last_n, repeat=repeat, frequency=frequency, presence=presence):
            return llama_cpp.llama_sampler_init_penalties(
                n_vocab, n_ctx if last_n < 0 else last_n, repeat, frequency, presence
            )
        case Dry():
            # Kronk: penalty_last_n 0 (or -1) = the whole context; llama.cpp: 0 = disabled.
            return dry.clone(stage, n_ctx if stage.penalty_last_n <= 0 else stage.penalty_last_n)
        case TopK(k=k):
            return llama_cpp.llama_sampler_init_top_k(k)
        case TypicalP(p=p, min_keep=min_keep):
            return llama_cpp.llama_sampler_init_typical(p, min_keep)
        case TopP(p=p, min_keep=min_keep):
            return llama_cpp.llama_sampler_init_top_p(p, min_keep)
        case MinP(p=p, min_keep=min_keep):
            return llama_cpp.llama_sampler_init_min_p(p, min_keep)
        case Xtc(probability=probability, threshold=threshold, min_keep=min_keep, seed=seed):
            return llama_cpp.llama_sampler_init_xtc(probability, threshold, min_keep, seed)
        case Temperature(value=value):
            return llama_cpp.llama_sampler_init_temp(value)
        case Greedy():
            return llama_cpp.llama_sampler_init_greedy()
        case Distribution(seed=seed):
            return llama_cpp.llama_sampler_init_dist(seed)
        case AdaptiveP(target=target, decay=decay, seed=seed):
            return llama_cpp.llama_sampler_init_adaptive_p(target, decay, seed)
        case Mirostat(tau=tau, eta=eta, seed=seed, m=m):
            return llama_cpp.llama_sampler_init_mirostat(n_vocab, seed, tau, eta, m)
        case MirostatV2(tau=tau, eta=eta, seed=seed):
            return llama_cpp.llama_sampler_init_mirostat_v2(seed, tau, eta)
    raise InvalidRequestError(f"the llamacpp backend has no sampler stage {stage!r}")


def build_sampler(
    ctx: llama_cpp.llama_context_p,
    n_vocab: int,
    n_ctx: int,
    stages: Sequence[SamplerStage],
    dry: DryPrototypes,
    grammars: GrammarCompiler,
) -> NativeSampler | GreedySampler:
    if not stages or not isinstance(stages[-1], SELECTING_STAGES):
        raise InvalidRequestError("a sampler chain must end with a token-selecting stage")
    if len(stages) == 1 and isinstance(stages[0], Greedy):
        return GreedySampler(ctx, n_vocab)
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    sampler: NativeSampler
    top_k = _top_k_behind_lowering_stages(stages)
    # llama.cpp's logit-bias stage looks each bias up among a shortlist's candidates one by
    # one: past a few hundred biases that costs more than the whole vocabulary's chain
    # (100,000 biases: 140 ms a token against 2.4).
    short = all(
        len(stage.biases) <= SHORTLIST_MAX_BIASES
        for stage in stages
        if isinstance(stage, LogitBias)
    )
    lowering = all(_only_lowers(stage) for stage in stages[:-1])
    if short and isinstance(stages[-1], Greedy) and lowering:
        sampler = ShortlistGreedySampler(ctx, chain, n_vocab)
    elif short and isinstance(stages[-1], Distribution) and top_k is not None:
        index, k = top_k
        sampler = ShortlistTopKSampler(ctx, chain, n_vocab, k, index)
    else:
        sampler = NativeSampler(ctx, chain, n_vocab, draws=isinstance(stages[-1], Distribution))
    try:
        for stage in stages:
            llama_cpp.llama_sampler_chain_add(
                chain, _native_stage(stage, n_vocab, n_ctx, dry, grammars)
            )
    except BaseException:
        sampler.close()
        raise
    return sampler
