"""Embeddings and reranking on a loaded EmbeddingModel: input checks, truncation, results."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from kronk_core.contract.backend import Capability, EmbeddingModel, ModelInfo
from kronk_core.contract.errors import CapabilityError, InvalidRequestError
from kronk_core.settings.config import ModelConfig

# One input: text, or token ids used as given (no special tokens added).
EmbeddingInput = str | Sequence[int]


@dataclass(frozen=True, slots=True)
class EmbeddingResult:
    model: str
    vectors: list[list[float]]
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class RankedDocument:
    index: int  # position in the request's documents
    relevance_score: float  # sigmoid of the model's logit, in (0, 1)
    document: str


@dataclass(frozen=True, slots=True)
class RerankResult:
    model: str
    results: list[RankedDocument]  # best first
    prompt_tokens: int


def describe_capabilities(model_id: str, info: ModelInfo) -> str:
    can = ", ".join(sorted(info.capabilities)) or "nothing"
    return f"model {model_id!r} supports {can}"


def require(model_id: str, info: ModelInfo, capability: Capability) -> None:
    """CapabilityError (400) naming what the model can do, unless it can do `capability`."""
    if capability not in info.capabilities:
        raise CapabilityError(
            f"{describe_capabilities(model_id, info)}, not {capability}", param="model"
        )


class LoadedEmbeddingModel:
    """An embedding or reranking model in the pool; counts its running calls."""

    def __init__(self, config: ModelConfig, model: EmbeddingModel) -> None:
        self.config = config
        self.model = model
        self._running = 0
        self._lock = threading.Lock()

    @property
    def id(self) -> str:
        return self.config.id

    @property
    def info(self) -> ModelInfo:
        return self.model.info

    @property
    def busy(self) -> bool:
        return self._running > 0

    @property
    def active_requests(self) -> int:
        return self._running

    def close(self) -> None:
        self.model.close()

    def _track(self, delta: int) -> None:
        with self._lock:
            self._running += delta

    # ---- embeddings --------------------------------------------------------

    def embed(
        self, inputs: Sequence[EmbeddingInput], *, dimensions: int | None, truncate: bool
    ) -> EmbeddingResult:
        """Blocking: run on a worker thread."""
        info = self.info
        require(self.id, info, Capability.embeddings)
        size = self._dimensions(dimensions)
        tokens = [self._input_tokens(index, item, truncate) for index, item in enumerate(inputs)]
        self._track(1)
        try:
            vectors = self.model.embed(tokens, size)
        finally:
            self._track(-1)
        return EmbeddingResult(self.id, vectors, sum(len(item) for item in tokens))

    def _dimensions(self, dimensions: int | None) -> int:
        native = self.info.n_embd
        if dimensions is None or dimensions == native:
            return native
        if not self.config.matryoshka:
            raise InvalidRequestError(
                f"model {self.id!r} returns {native} dimensions and was not trained to be cut "
                "shorter; omit dimensions (set matryoshka: true in its model config if it was)",
                param="dimensions",
            )
        if not 1 <= dimensions <= native:
            raise InvalidRequestError(
                f"dimensions must be between 1 and {native} for {self.id!r}, got {dimensions}",
                param="dimensions",
            )
        return dimensions

    def _input_tokens(self, index: int, item: EmbeddingInput, truncate: bool) -> list[int]:
        limit = self.info.n_ctx_per_seq
        if isinstance(item, str):
            if not item:
                raise InvalidRequestError(f"input[{index}] is an empty string", param="input")
            prefix, suffix = self.model.affixes()
            body = self.model.tokenize(item, add_special=False, parse_special=False)
            room = limit - len(prefix) - len(suffix)
            if truncate:
                body = body[:room]
            tokens = prefix + body + suffix
        else:
            tokens = list(item)
            bad = [token for token in tokens if not 0 <= token < self.info.n_vocab]
            if not tokens or bad:
                raise InvalidRequestError(
                    f"input[{index}] must hold token ids in 0..{self.info.n_vocab - 1}",
                    param="input",
                )
            if truncate:
                tokens = tokens[:limit]
        if len(tokens) > limit:
            raise InvalidRequestError(
                f"input[{index}] has {len(tokens)} tokens but the context of {self.id!r} is "
                f"{limit}; shorten it or set truncate: true",
                param="input",
            )
        return tokens

    # ---- reranking ---------------------------------------------------------

    def rerank(self, query: str, documents: Sequence[str], *, top_n: int | None) -> RerankResult:
        """Blocking: run on a worker thread. Every document is scored on its own pair."""
        require(self.id, self.info, Capability.rerank)
        limit = self.info.n_ctx_per_seq
        pairs = [self.model.pair_tokens(query, document) for document in documents]
        for index, pair in enumerate(pairs):
            if len(pair) > limit:
                raise InvalidRequestError(
                    f"documents[{index}] with the query has {len(pair)} tokens but the context "
                    f"of {self.id!r} is {limit}; shorten it",
                    param="documents",
                )
        self._track(1)
        try:
            scores = self.model.score(pairs)
        finally:
            self._track(-1)
        # Order by the raw logit: the sigmoid saturates, and ties would lose the order.
        order = sorted(range(len(scores)), key=lambda index: (-scores[index], index))
        ranked = [
            RankedDocument(index, _sigmoid(scores[index]), documents[index])
            for index in order[:top_n]
        ]
        return RerankResult(self.id, ranked, sum(len(pair) for pair in pairs))


def _sigmoid(logit: float) -> float:
    if logit >= 0:
        return 1.0 / (1.0 + math.exp(-logit))
    exp = math.exp(logit)
    return exp / (1.0 + exp)
