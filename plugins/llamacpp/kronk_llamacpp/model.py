"""A GGUF model and its llama.cpp context, driven by one Kronk engine thread."""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Concatenate, ParamSpec, TypeVar

import llama_cpp
import numpy as np

from kronk_core.contract import (
    GRAMMAR_STAGES,
    Adapters,
    Batch,
    EngineClosedError,
    FimTokens,
    Greedy,
    KronkError,
    KVCacheFullError,
    ModelConfig,
    ModelInfo,
    ModelLoadError,
    SamplerStage,
    TokenLogprob,
    TopLogprob,
)
from kronk_llamacpp.adapters import LoraAdapters
from kronk_llamacpp.compute import CpuThread, HostedLoop, runner
from kronk_llamacpp.estimate import kv_bytes_per_token
from kronk_llamacpp.gguf_meta import read_metadata
from kronk_llamacpp.grammar_compiler import GrammarCompiler
from kronk_llamacpp.params import context_params
from kronk_llamacpp.rpc import RpcLinks
from kronk_llamacpp.sampler import (
    DeviceGreedySamplers,
    DryPrototypes,
    GreedySampler,
    NativeSampler,
    build_sampler,
)
from kronk_llamacpp.settings import SETTINGS, RopeScaling
from kronk_llamacpp.vocab import tokenize
from kronk_llamacpp.weights import load_weights, metadata

log = logging.getLogger(__name__)

# Rows one sequence may sample on the device in one decode: a token and its draft tokens.
DEVICE_SAMPLED_ROWS = 64


def decode_error(status: int) -> KronkError:
    """What a failed llama_decode means for the request whose tokens it refused."""
    if status == 1:  # no KV cell for the batch: finished requests will free some
        return KVCacheFullError(
            "the KV cache has no room for this request's tokens now (llama_decode status 1); "
            "retry later"
        )
    return KronkError(f"llama_decode failed with status {status}")


def fim_tokens(vocab: llama_cpp.llama_vocab_p) -> FimTokens | None:
    """The vocabulary's fill-in-the-middle tokens (llama.cpp finds them by metadata or by
    their text, `<|fim_prefix|>` and its kin); None without prefix, suffix and middle."""

    def found(token: int) -> int | None:
        return None if token < 0 else token

    prefix = found(llama_cpp.llama_vocab_fim_pre(vocab))
    suffix = found(llama_cpp.llama_vocab_fim_suf(vocab))
    middle = found(llama_cpp.llama_vocab_fim_mid(vocab))
    if prefix is None or suffix is None or middle is None:
        return None
    repo = found(llama_cpp.llama_vocab_fim_rep(vocab))
    separator = found(llama_cpp.llama_vocab_fim_sep(vocab))
    return FimTokens(prefix, suffix, middle, repo, separator)


_Params = ParamSpec("_Params")
_Result = TypeVar("_Result")
_Model = TypeVar("_Model", bound="LlamaTextModel")


def while_open(
    method: Callable[Concatenate[_Model, _Params], _Result],
) -> Callable[Concatenate[_Model, _Params], _Result]:
    """A method that calls into llama.cpp: on a closed model it would read freed memory and
    abort the process (a model object held past `Kronk.close()`), so it raises instead."""

    @functools.wraps(method)
    def guarded(model: _Model, /, *args: _Params.args, **kwargs: _Params.kwargs) -> _Result:
        if model._model is None:
            raise EngineClosedError(f"the model {model.info.id} was unloaded")
        return method(model, *args, **kwargs)

    return guarded


class LlamaTextModel:
    """Implements kronk_core.contract.backend.TextModel over llama.cpp's low-level API."""

    def __init__(self, config: ModelConfig, weights: llama_cpp.llama_model_p | None = None) -> None:
        self._model = weights or load_weights(config)
        servers = SETTINGS.of(config).rpc_servers
        # Found once the load has connected to them.
        self._rpc = RpcLinks(servers) if servers else None
        self._compute = runner(config)
        self._ctx: llama_cpp.llama_context_p | None = None
        self._batch: llama_cpp.llama_batch | None = None
        self._dry: DryPrototypes | None = None
        self._device_greedy: DeviceGreedySamplers | None = None
        try:
            self._open_context(config)
        except BaseException:
            self.close()
            raise

    def _open_context(self, config: ModelConfig) -> None:
        model = self._model
        llama = SETTINGS.of(config)
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        found = metadata(model)
        n_ctx_train = llama_cpp.llama_model_n_ctx_train(model)
        # The backend chooses one for an entry without (estimate.choose_context).
        context_window = config.context_window or n_ctx_train
        if context_window > n_ctx_train and llama.rope_scaling is RopeScaling.none:
            log.warning(
                "context_window %d of %s is beyond the model's training length %d and "
                "rope_scaling is none: expect degraded output past %d tokens "
                "(set rope_scaling: yarn to extend the context)",
                context_window,
                config.id,
                n_ctx_train,
                n_ctx_train,
            )
        params = context_params(config, model, context_window, n_ctx_train)
        if llama.rope_scaling is not RopeScaling.none and llama.rope_freq_scale is None:
            log.info(
                "%s: rope_scaling %s over %d tokens (trained %d): rope_freq_scale %.4g",
                config.id,
                llama.rope_scaling.value,
                context_window,
                n_ctx_train,
                params.rope_freq_scale,
            )
        if llama.device_sampling:
            params.n_outputs_max_per_seq = DEVICE_SAMPLED_ROWS
        self._ctx = llama_cpp.llama_init_from_model(model, params)
        if not self._ctx:
            raise ModelLoadError(
                f"context_window: llama.cpp could not create a context of {context_window} tokens "
                f"x {config.n_seq_max} slots for {config.id} (out of memory?)"
            )
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._lora = LoraAdapters(model, config)
        # llama.cpp may round the pool up; a slot gets its share of what exists.
        self.n_ctx_per_seq = int(llama_cpp.llama_n_ctx(self._ctx)) // config.n_seq_max
        self._n_batch = config.n_batch
        self._batch = llama_cpp.llama_batch_init(config.n_batch, 0, config.n_seq_max)
        self._tokens = np.ctypeslib.as_array(self._batch.token, shape=(config.n_batch,))
        self._positions = np.ctypeslib.as_array(self._batch.pos, shape=(config.n_batch,))
        self._want_logits = np.ctypeslib.as_array(self._batch.logits, shape=(config.n_batch,))
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(config.n_batch,))[:] = 1
        self._seq_ids = self._batch.seq_id
        self._pieces: dict[int, bytes] = {}
        self._special_pieces: dict[int, bytes] = {}
        self._piece_buffer = ctypes.create_string_buffer(256)
        self._dry = DryPrototypes(self._vocab)
        self._grammars = GrammarCompiler(
            self._vocab,
            llama.structured_output,
            f"{config.section_key(SETTINGS.name)}.structured_output",
        )
        template = llama_cpp.llama_model_chat_template(model, None)
        self._unified = bool(params.kv_unified)
        self._recurrent = bool(
            llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model)
        )
        n_swa = int(llama_cpp.llama_model_n_swa(model))
        if llama.device_sampling:
            self._device_greedy = DeviceGreedySamplers(self._ctx, self.n_vocab)
        arch = found.get("general.architecture", "unknown")
        # Layer by layer, from the file's header as the estimate reads it: a hybrid's
        # recurrent layers keep no KV, and a head's size defaults to n_embd / n_head.
        assert config.model_path is not None  # llama.cpp loaded the weights from it
        _, kv_bytes = kv_bytes_per_token(llama, read_metadata(config.model_path))
        self.info = ModelInfo(
            id=config.id,
            path=str(config.model_path),
            architecture=arch,
            n_ctx_train=n_ctx_train,
            n_ctx_per_seq=self.n_ctx_per_seq,
            n_seq_max=config.n_seq_max,
            n_vocab=self.n_vocab,
            bos_token=self.token_text(llama_cpp.llama_vocab_bos(self._vocab)),
            eos_token=self.token_text(llama_cpp.llama_vocab_eos(self._vocab)),
            chat_template=template.decode("utf-8") if template else None,
            kv_bytes_per_token=int(kv_bytes),
            kv_trimmable=not (self._recurrent or (n_swa > 0 and not llama.swa_full)),
            n_swa=n_swa,
            n_ubatch=int(llama_cpp.llama_n_ubatch(self._ctx)),
            recurrent=self._recurrent,
            kv_shiftable=bool(llama_cpp.llama_memory_can_shift(self._memory))
            and not (n_swa or self._recurrent),
            metadata=found,
            n_embd=llama_cpp.llama_model_n_embd(model),
            memory_bytes=int(
                llama_cpp.llama_model_size(model) + kv_bytes * llama_cpp.llama_n_ctx(self._ctx)
            ),
            overlap_decode=llama.overlap_decode,
            fim=fim_tokens(self._vocab),
            adapters=self._lora.info,
        )

    # ---- tokens ------------------------------------------------------------

    @while_open
    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return tokenize(self._vocab, text, add_special=add_special, parse_special=parse_special)

    def _piece(self, token: int, special: bool) -> bytes:
        buffer = self._piece_buffer
        size = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, len(buffer), 0, special)
        if size < 0:
            buffer = ctypes.create_string_buffer(-size)
            size = llama_cpp.llama_token_to_piece(
                self._vocab, token, buffer, len(buffer), 0, special
            )
        return buffer.raw[:size]

    @while_open
    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        cache = self._special_pieces if special else self._pieces
        piece = cache.get(token)
        if piece is None:
            piece = cache[token] = self._piece(token, special)
        return piece

    @while_open
    def token_text(self, token: int) -> str:
        return self._piece(token, True).decode("utf-8", errors="replace")

    @while_open
    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    # ---- decoding ----------------------------------------------------------

    @while_open
    def decode(self, batch: Batch) -> None:
        count = len(batch)
        if not 0 < count <= self._n_batch:
            raise KronkError(f"batch of {count} tokens outside 1..{self._n_batch}")
        assert self._batch is not None
        self._tokens[:count] = batch.tokens
        self._positions[:count] = batch.positions
        self._want_logits[:count] = batch.logits
        seq_ids = self._seq_ids
        for index, seq_id in enumerate(batch.seq_ids):
            seq_ids[index][0] = seq_id
        self._batch.n_tokens = count
        self.check_workers()
        status = self._compute(llama_cpp.llama_decode, self._ctx, self._batch)
        if status != 0:
            raise decode_error(status)

    def engine_thread(self, name: str) -> HostedLoop | None:
        """The CPU compute thread, for the first model on the CPU to ask (compute.py)."""
        compute = self._compute
        return compute.engine_thread(name) if isinstance(compute, CpuThread) else None

    def check_workers(self) -> None:
        """BackendLostError if one of the model's RPC workers is gone."""
        if self._rpc is not None:
            self._rpc.check(self.info.id)

    @while_open
    def synchronize(self) -> None:
        llama_cpp.llama_synchronize(self._ctx)

    @while_open
    def logprobs(self, batch_index: int, token: int, top_n: int) -> TokenLogprob:
        pointer = llama_cpp.llama_get_logits_ith(self._ctx, batch_index)
        logits = np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).astype(np.float64)
        peak = logits.max()
        logsumexp = peak + np.log(np.exp(logits - peak).sum())
        top: tuple[TopLogprob, ...] = ()
        if top_n > 0:
            best = np.argpartition(-logits, top_n)[:top_n]
            best = best[np.argsort(-logits[best], kind="stable")]
            top = tuple(self._top(int(t), float(logits[t] - logsumexp)) for t in best)
        raw = self._piece(token, True)
        return TokenLogprob(
            token=raw.decode("utf-8", errors="replace"),
            logprob=min(0.0, float(logits[token] - logsumexp)),
            bytes=tuple(raw),
            top_logprobs=top,
        )

    def _top(self, token: int, logprob: float) -> TopLogprob:
        raw = self._piece(token, True)
        return TopLogprob(
            token=raw.decode("utf-8", errors="replace"), logprob=min(0.0, logprob), bytes=tuple(raw)
        )

    @while_open
    def compile_stages(self, stages: Sequence[SamplerStage]) -> list[SamplerStage]:
        return [
            self._grammars.compile(stage) if isinstance(stage, GRAMMAR_STAGES) else stage
            for stage in stages
        ]

    @while_open
    def new_sampler(
        self, stages: Sequence[SamplerStage], *, seq_id: int | None = None, logits: bool = True
    ) -> NativeSampler | GreedySampler:
        assert self._ctx is not None and self._dry is not None
        if seq_id is not None and self._device_greedy is not None:
            greedy = not logits and len(stages) == 1 and isinstance(stages[0], Greedy)
            device = self._device_greedy.bind(seq_id, greedy)
            if device is not None:
                return device
        return build_sampler(
            self._ctx, self.n_vocab, self.n_ctx_per_seq, stages, self._dry, self._grammars
        )

    # ---- KV sequences ------------------------------------------------------

    @while_open
    def use_adapters(self, adapters: Adapters) -> None:
        assert self._ctx is not None
        self._lora.apply(self._ctx, adapters)

    def _position(self, seq_id: int, index: int) -> int:
        """The KV position of the sequence's token at `index` (-1, the end, stays -1): the
        index itself, but where media take fewer positions than tokens (M-RoPE, media.py)."""
        return index

    @while_open
    def seq_remove(self, seq_id: int, start: int, end: int) -> bool:
        first, last = self._position(seq_id, start), self._position(seq_id, end)
        return bool(llama_cpp.llama_memory_seq_rm(self._memory, seq_id, first, last))

    @while_open
    def seq_copy(self, src: int, dst: int, start: int, end: int) -> None:
        if not self._unified:
            # Sequences in streams of their own: llama.cpp copies a whole stream (its
            # buffers, at the next decode), then dst drops what lies past `end`.
            llama_cpp.llama_memory_seq_cp(self._memory, src, dst, -1, -1)
            if end >= 0:
                self.seq_remove(dst, end, -1)
            return
        first, last = self._position(src, start), self._position(src, end)
        llama_cpp.llama_memory_seq_cp(self._memory, src, dst, first, last)
        if self.info.n_swa and not self.info.kv_trimmable and not self._recurrent:
            # llama.cpp recycles a window cell that left the window only while one
            # sequence holds it: cells shared by a copy would stay until both sequences
            # cut them, and the small window cache fills up. Give dst its own window
            # cells (the full-attention cells stay shared), then drop those past `end`.
            copied = self._set_partial_state(dst, self._partial_state(src))
            if not copied or (end >= 0 and not self.seq_remove(dst, end, -1)):
                raise KronkError(f"could not copy the window cache of sequence {src} to {dst}")

    @while_open
    def seq_shift(self, seq_id: int, start: int, end: int, delta: int) -> None:
        first, last = self._position(seq_id, start), self._position(seq_id, end)
        llama_cpp.llama_memory_seq_add(self._memory, seq_id, first, last, delta)

    @while_open
    def seq_state(self, seq_id: int) -> bytes:
        size = llama_cpp.llama_state_seq_get_size(self._ctx, seq_id)
        buffer = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._ctx, buffer, size, seq_id)
        return ctypes.string_at(buffer, written)

    @while_open
    def set_seq_state(self, seq_id: int, state: bytes) -> int:
        buffer = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        return int(llama_cpp.llama_state_seq_set_data(self._ctx, buffer, len(state), seq_id))

    @while_open
    def kv_positions(self, seq_id: int) -> tuple[int, int]:
        """The lowest and highest position llama.cpp holds for the sequence ((-1, -1):
        none). Positions, not token indices: under M-RoPE an image takes fewer."""
        low = int(llama_cpp.llama_memory_seq_pos_min(self._memory, seq_id))
        return low, int(llama_cpp.llama_memory_seq_pos_max(self._memory, seq_id))

    @while_open
    def trim_floor(self, seq_id: int) -> int:
        if self._recurrent:
            return int(llama_cpp.llama_memory_seq_pos_max(self._memory, seq_id)) + 1
        if not self.info.n_swa:
            return 0
        # The token at position p attends to positions above p - n_swa; the cache
        # holds positions from pos_min on, so a cut at p is exact from pos_min + n_swa
        # (one position of margin) unless nothing was dropped yet. A full-size window
        # cache (swa_full) drops positions too: llama.cpp reuses a cell whose position
        # left the window whenever its search for free cells passes it.
        lowest = int(llama_cpp.llama_memory_seq_pos_min(self._memory, seq_id))
        return 0 if lowest <= 0 else lowest + self.info.n_swa

    @while_open
    def checkpoint(self, seq_id: int) -> bytes:
        return self._partial_state(seq_id)

    def _partial_state(self, seq_id: int) -> bytes:
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = llama_cpp.llama_state_seq_get_size_ext(self._ctx, seq_id, flags)
        buffer = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data_ext(self._ctx, buffer, size, seq_id, flags)
        return ctypes.string_at(buffer, written)

    @while_open
    def restore_checkpoint(self, seq_id: int, length: int, state: bytes) -> bool:
        # The partial state replaces the window cells; the full-attention cells
        # beyond the checkpoint still have to go.
        return self._set_partial_state(seq_id, state) and self.seq_remove(seq_id, length, -1)

    def _set_partial_state(self, seq_id: int, state: bytes) -> bool:
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        buffer = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        read = llama_cpp.llama_state_seq_set_data_ext(self._ctx, buffer, len(state), seq_id, flags)
        return bool(read > 0)

    def close(self) -> None:
        if self._rpc is not None and self._rpc.lost is not None:
            # Freeing buffers on a worker that is gone makes ggml abort the process.
            log.warning("%s: its RPC worker is gone: its memory stays until exit", self.info.id)
            self._ctx = self._model = None
        if self._device_greedy is not None:
            self._device_greedy.close()
            self._device_greedy = None
        if self._dry is not None:
            self._dry.close()
            self._dry = None
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None
