"""Embedding and reranking GGUFs: one llama_model, a pool of independent contexts sharing it.

A call's inputs are cut into decode-sized groups, and the groups are spread
over the free contexts, one thread per context (llama.cpp's ctypes calls
release the GIL); inside a context a group is one llama_decode with one
sequence id per input, read back with llama_get_embeddings_seq.
"""

from __future__ import annotations

import ctypes
import math
import os
import queue
import threading
from collections.abc import Iterator, Sequence

import llama_cpp
import numpy as np

from kronk_core.contract import (
    Capability,
    KronkError,
    ModelConfig,
    ModelInfo,
    ModelLoadError,
    Pooling,
)
from kronk_llamacpp.compute import Runner, run_here, runner
from kronk_llamacpp.params import context_params
from kronk_llamacpp.settings import SETTINGS
from kronk_llamacpp.vocab import tokenize
from kronk_llamacpp.weights import metadata

DEFAULT_CONTEXT_WINDOW = 8192
# Sequences in one decode: several short inputs share a call; the context's n_seq_max.
SEQS_PER_DECODE = 64

_POOLING = {1: Pooling.mean, 2: Pooling.cls, 3: Pooling.last, 4: Pooling.rank}


def pooling_of(found: dict[str, str]) -> Pooling | None:
    """The pooling a GGUF declares (`{arch}.pooling_type`); None for text-generation models."""
    arch = found.get("general.architecture", "")
    value = found.get(f"{arch}.pooling_type")
    return None if value is None else _POOLING.get(int(value))


class _Context:
    """One llama_context (embeddings on, the model's pooling) and its reusable batch."""

    def __init__(
        self,
        weights: llama_cpp.llama_model_p,
        params: llama_cpp.llama_context_params,
        compute: Runner,
    ) -> None:
        self._compute = compute
        self.n_batch = int(params.n_batch)
        self._ctx = llama_cpp.llama_init_from_model(weights, params)
        if not self._ctx:
            raise ModelLoadError(
                f"llama.cpp could not create an embedding context of {params.n_ctx} tokens "
                "(out of memory?)"
            )
        self._memory = llama_cpp.llama_get_memory(self._ctx)  # NULL for encoder-only models
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self._tokens = np.ctypeslib.as_array(self._batch.token, shape=(self.n_batch,))
        self._positions = np.ctypeslib.as_array(self._batch.pos, shape=(self.n_batch,))
        # Every token is an output: mean pooling reads them all, last pooling its last.
        np.ctypeslib.as_array(self._batch.logits, shape=(self.n_batch,))[:] = 1
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(self.n_batch,))[:] = 1
        self.state_bytes = int(llama_cpp.llama_state_get_size(self._ctx))

    def run(self, inputs: Sequence[Sequence[int]], width: int) -> np.ndarray:
        """Pooled outputs (first `width` floats) of each input, decoded together."""
        count = 0
        seq_ids = self._batch.seq_id
        for seq, tokens in enumerate(inputs):
            end = count + len(tokens)
            self._tokens[count:end] = tokens
            self._positions[count:end] = np.arange(len(tokens))
            for index in range(count, end):
                seq_ids[index][0] = seq
            count = end
        self._batch.n_tokens = count
        status = self._compute(llama_cpp.llama_decode, self._ctx, self._batch)
        if status != 0:
            raise KronkError(f"llama_decode failed with status {status}")
        rows = np.empty((len(inputs), width), dtype=np.float32)
        for seq in range(len(inputs)):
            pointer = llama_cpp.llama_get_embeddings_seq(self._ctx, seq)
            if not pointer:
                raise KronkError("llama.cpp returned no pooled embedding")
            rows[seq] = np.ctypeslib.as_array(pointer, shape=(width,))
        if self._memory:
            llama_cpp.llama_memory_clear(self._memory, True)
        return rows

    def close(self) -> None:
        llama_cpp.llama_batch_free(self._batch)
        llama_cpp.llama_free(self._ctx)


class LlamaEmbeddingModel:
    """Implements kronk_core.contract.backend.EmbeddingModel.

    n_seq_max is the number of contexts.
    """

    def __init__(
        self, config: ModelConfig, weights: llama_cpp.llama_model_p, pooling: Pooling
    ) -> None:
        self._model: llama_cpp.llama_model_p | None = weights
        self._contexts: list[_Context] = []
        self._free: queue.Queue[_Context] = queue.Queue()
        try:
            self._open(config, pooling)
        except BaseException:
            self.close()
            raise

    def _open(self, config: ModelConfig, pooling: Pooling) -> None:
        model = self._model
        found = metadata(model)
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        n_ctx_train = llama_cpp.llama_model_n_ctx_train(model)
        n_ctx = config.context_window or min(n_ctx_train, DEFAULT_CONTEXT_WINDOW)
        params = context_params(config.model_copy(update={"n_seq_max": 1}), model, n_ctx)
        # A whole input must fit one micro-batch: non-causal models cannot split a sequence.
        params.n_batch = params.n_ubatch = n_ctx
        params.n_seq_max = SEQS_PER_DECODE
        params.embeddings = True
        params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED  # the GGUF's own
        compute = runner(config)
        # The contexts run at once: share the cores instead of oversubscribing them; on the
        # one CPU compute thread (kronk_llamacpp/compute.py) they take turns, each with all.
        cores = os.cpu_count() or 1
        shared = max(1, cores // config.n_seq_max) if compute is run_here else cores
        threads = SETTINGS.of(config).n_threads or shared
        params.n_threads = params.n_threads_batch = threads
        for _ in range(config.n_seq_max):
            context = _Context(model, params, compute)
            self._contexts.append(context)
            self._free.put(context)
        if pooling is Pooling.rank:
            # Some rerankers (jina v1) report no class count; their head still gives one score.
            self._width = max(1, llama_cpp.llama_model_n_cls_out(model))
        else:
            self._width = llama_cpp.llama_model_n_embd_out(model)
        template = llama_cpp.llama_model_chat_template(model, b"rerank")
        self._rerank_template = template.decode("utf-8") if template else None
        self.info = ModelInfo(
            id=config.id,
            path=str(config.model_path),
            architecture=found.get("general.architecture", "unknown"),
            n_ctx_train=n_ctx_train,
            n_ctx_per_seq=n_ctx,
            n_seq_max=config.n_seq_max,
            n_vocab=llama_cpp.llama_vocab_n_tokens(self._vocab),
            bos_token=self._token_text(llama_cpp.llama_vocab_bos(self._vocab)),
            eos_token=self._token_text(llama_cpp.llama_vocab_eos(self._vocab)),
            chat_template=None,
            metadata=found,
            capabilities=frozenset(
                {Capability.rerank if pooling is Pooling.rank else Capability.embeddings}
            ),
            pooling=pooling,
            n_embd=self._width,
            memory_bytes=int(llama_cpp.llama_model_size(model))
            + sum(context.state_bytes for context in self._contexts),
        )

    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        buffer = ctypes.create_string_buffer(64)
        size = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, len(buffer), 0, True)
        return buffer.raw[: max(size, 0)].decode("utf-8", errors="replace")

    # ---- tokens ------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return tokenize(self._vocab, text, add_special=add_special, parse_special=parse_special)

    def affixes(self) -> tuple[list[int], list[int]]:
        vocab = self._vocab
        prefix = (
            [llama_cpp.llama_vocab_bos(vocab)] if llama_cpp.llama_vocab_get_add_bos(vocab) else []
        )
        suffix = [self._eos()] if llama_cpp.llama_vocab_get_add_eos(vocab) else []
        if llama_cpp.llama_vocab_get_add_sep(vocab):
            suffix.append(llama_cpp.llama_vocab_sep(vocab))
        return prefix, suffix

    def _eos(self) -> int:
        eos = int(llama_cpp.llama_vocab_eos(self._vocab))
        return eos if eos >= 0 else int(llama_cpp.llama_vocab_sep(self._vocab))

    def pair_tokens(self, query: str, document: str) -> list[int]:
        """As llama.cpp's server: the GGUF's "rerank" template, else [BOS]q[EOS][SEP]d[EOS]."""
        if self._rerank_template is not None:
            prompt = self._rerank_template.replace("{query}", query).replace("{document}", document)
            return self.tokenize(prompt, add_special=False, parse_special=True)
        vocab = self._vocab
        eos = [self._eos()] if llama_cpp.llama_vocab_get_add_eos(vocab) else []
        pair = (
            [llama_cpp.llama_vocab_bos(vocab)] if llama_cpp.llama_vocab_get_add_bos(vocab) else []
        )
        pair += self.tokenize(query, add_special=False, parse_special=False) + eos
        if llama_cpp.llama_vocab_get_add_sep(vocab):
            pair.append(llama_cpp.llama_vocab_sep(vocab))
        return pair + self.tokenize(document, add_special=False, parse_special=False) + eos

    # ---- running -----------------------------------------------------------

    def embed(self, inputs: Sequence[Sequence[int]], dimensions: int) -> list[list[float]]:
        rows = self._run(inputs)[:, :dimensions]
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        unit: list[list[float]] = (rows / np.maximum(norms, 1e-12)).tolist()
        return unit

    def score(self, inputs: Sequence[Sequence[int]]) -> list[float]:
        # One pair per decode: a document's score must not depend on the others sent with it
        # (batching changes float rounding), and rerank requests are small.
        scores: list[float] = self._run(inputs, alone=True)[:, 0].tolist()
        return scores

    def _run(self, inputs: Sequence[Sequence[int]], *, alone: bool = False) -> np.ndarray:
        """Every input's pooled output, the groups spread over as many contexts as help."""
        out = np.empty((len(inputs), self._width), dtype=np.float32)
        groups = iter([[index] for index in range(len(inputs))]) if alone else self._groups(inputs)
        lock = threading.Lock()
        failures: list[BaseException] = []

        def work() -> None:
            context = self._free.get()
            try:
                while True:
                    with lock:
                        group = next(groups, None)
                    if group is None or failures:
                        return
                    out[group] = context.run([inputs[index] for index in group], self._width)
            except BaseException as exc:
                failures.append(exc)
            finally:
                self._free.put(context)

        helpers = [
            threading.Thread(target=work, name="kronk-embed", daemon=True)
            for _ in range(min(len(self._contexts), len(inputs)) - 1)
        ]
        for helper in helpers:
            helper.start()
        work()
        for helper in helpers:
            helper.join()
        if failures:
            raise failures[0]
        return out

    def _groups(self, inputs: Sequence[Sequence[int]]) -> Iterator[list[int]]:
        """Consecutive inputs per decode, sized so that every context gets a share."""
        total = sum(len(tokens) for tokens in inputs)
        share = math.ceil(total / len(self._contexts))
        limit = min(self._contexts[0].n_batch, max(share, max(len(t) for t in inputs)))
        group: list[int] = []
        used = 0
        for index, tokens in enumerate(inputs):
            if group and (used + len(tokens) > limit or len(group) == SEQS_PER_DECODE):
                yield group
                group, used = [], 0
            group.append(index)
            used += len(tokens)
        if group:
            yield group

    def close(self) -> None:
        # Taking every context back waits for running calls to finish first.
        for _ in self._contexts:
            self._free.get().close()
        self._contexts.clear()
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None
