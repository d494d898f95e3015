"""A scripted stand-in for a text model, so the engine runs in tests without llama.cpp.

It implements the core's `StrategyModel` protocol (kronk_core/contract/backend.py) and is
registered as a backend like any (`kronk_register_backends`): this module is the plugin,
registered in-process (`Kronk(plugins={"scripted": kronk_testing.scripted})`), and it
loads the models whose entry says `backend: scripted`. Their `model_path` is a script
file (JSON, `write_script`); it recognises no files, ships no models, lists no devices and
estimates nothing.

- Vocabulary: four special tokens (`<s>`, `</s>`, `<|im_start|>`, `<|im_end|>`), the
  256 bytes, then five fill-in-the-middle tokens (`<|fim_prefix|>`, `<|fim_suffix|>`,
  `<|fim_middle|>`, `<|repo_name|>`, `<|file_sep|>`); text tokenizes byte by byte, so
  any prompt does. The chat template
  is ChatML; `<|im_end|>` and `</s>` end generation.
- Answers: greedy on the script, whatever the sampler stages say (grammars are
  refused). The answer to a prompt is the reply of the script's trigger that occurs
  last in what the sequence's KV holds when the first token is sampled, else the
  default reply (the special tokens' text in it reads as those tokens); `{tokens}` and
  `{digest}` in a reply become the number of tokens that sequence holds and a CRC-32
  of their ids, so a test reads what the model saw.
- KV: every sequence records its token ids. A decode must continue each sequence at
  its length (a gap or an overlap raises KronkError, as must a sequence past the
  context), which makes the engine's and the cache strategies' bookkeeping
  checkable: `sequence(seq_id)` must equal the slot's `tokens`. A cut in the middle
  of a sequence is refused (`seq_remove` returns False); nothing needs checkpoints.
- `pause()` holds every decode until `allow(n)` lets n through or `resume()` all, so a
  test can look at queued and running requests without depending on the machine's speed.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kronk_core import hookimpl
from kronk_core.contract import (
    GRAMMAR_STAGES,
    Backend,
    BackendLostError,
    Batch,
    Device,
    FimTokens,
    InvalidRequestError,
    KronkError,
    MemoryEstimate,
    ModelConfig,
    ModelFacts,
    ModelFile,
    ModelInfo,
    ModelLoadError,
    PackagedModel,
    Register,
    SamplerStage,
    TokenDistribution,
    TokenLogprob,
    TopLogprob,
)

BACKEND = "scripted"
ARCHITECTURE = "scripted"

SPECIALS = ("<s>", "</s>", "<|im_start|>", "<|im_end|>")
BOS, EOS, IM_START, IM_END = range(len(SPECIALS))
# Fill-in-the-middle tokens as Qwen2.5-Coder spells them, after the bytes.
FIM_SPECIALS = (
    "<|fim_prefix|>",
    "<|fim_suffix|>",
    "<|fim_middle|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
FIM = FimTokens(*range(len(SPECIALS) + 256, len(SPECIALS) + 256 + len(FIM_SPECIALS)))
N_VOCAB = len(SPECIALS) + 256 + len(FIM_SPECIALS)
_SPECIAL_SPLIT = re.compile(
    "(" + "|".join(re.escape(text) for text in (*SPECIALS, *FIM_SPECIALS)) + ")"
)

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# The scripted token's probability; the rest of the vocabulary shares what is left.
_CHOSEN = 0.9


@dataclass(frozen=True)
class Script:
    """What a scripted model answers (see the module docstring)."""

    replies: tuple[tuple[str, str], ...] = ()
    default: str = "Hello from the scripted model."
    context_length: int = 4096
    # Seconds each decode takes: a model slow enough that a process under test can be
    # interrupted mid-answer (a terminal's Ctrl-C).
    decode_seconds: float = 0.0
    # Whether the model says it has its fill-in-the-middle tokens (ModelInfo.fim).
    fim: bool = True

    def reply(self, seen: str) -> str:
        """The reply for a sequence holding `seen`: the trigger found last wins."""
        found = [(seen.rfind(trigger), reply) for trigger, reply in self.replies]
        position, reply = max(found, default=(-1, self.default), key=lambda item: item[0])
        return reply if position >= 0 else self.default

    def to_json(self) -> str:
        return json.dumps(
            {
                "replies": [list(pair) for pair in self.replies],
                "default": self.default,
                "context_length": self.context_length,
                "decode_seconds": self.decode_seconds,
                "fim": self.fim,
            }
        )

    @classmethod
    def read(cls, path: Path) -> Script:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(
                replies=tuple((str(t), str(r)) for t, r in data.get("replies", ())),
                default=str(data.get("default", cls.default)),
                context_length=int(data.get("context_length", cls.context_length)),
                decode_seconds=float(data.get("decode_seconds", cls.decode_seconds)),
                fim=bool(data.get("fim", cls.fim)),
            )
        except (OSError, ValueError, TypeError) as exc:
            raise ModelLoadError(f"{path} is not a model script: {exc}") from None


def write_script(path: Path, script: Script | None = None) -> Path:
    """Write a script file that a `backend: scripted` model entry loads from `model_path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((script or Script()).to_json(), encoding="utf-8")
    return path


def tokenize(text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
    """Special tokens (when parsed) and bytes; BOS first with add_special."""
    tokens = [BOS] if add_special else []
    pieces = _SPECIAL_SPLIT.split(text) if parse_special else [text]
    for piece in pieces:
        if parse_special and piece in SPECIALS:
            tokens.append(SPECIALS.index(piece))
        elif parse_special and piece in FIM_SPECIALS:
            tokens.append(FIM.prefix + FIM_SPECIALS.index(piece))
        else:
            tokens.extend(len(SPECIALS) + byte for byte in piece.encode("utf-8"))
    return tokens


def token_bytes(token: int, *, special: bool = False) -> bytes:
    if token < len(SPECIALS):
        return SPECIALS[token].encode() if special else b""
    if token >= FIM.prefix:
        return FIM_SPECIALS[token - FIM.prefix].encode() if special else b""
    return bytes([token - len(SPECIALS)])


def digest(tokens: Sequence[int]) -> str:
    """The CRC-32 of token ids as a reply's `{digest}` shows it."""
    return f"{zlib.crc32(json.dumps(list(tokens)).encode()):08x}"


class ScriptedSampler:
    """One request's chain: the scripted reply, token by token, then `<|im_end|>`."""

    def __init__(self, model: ScriptedModel) -> None:
        self._model = model
        self._reply: list[int] | None = None
        self._next = 0

    def _expected(self, batch_index: int) -> int:
        if self._reply is None:
            seq_id = self._model.row(batch_index)
            seen = self._model.sequence(seq_id)
            text = b"".join(token_bytes(t, special=True) for t in seen).decode("utf-8", "replace")
            reply = self._model.script.reply(text)
            reply = reply.replace("{tokens}", str(len(seen))).replace("{digest}", digest(seen))
            self._reply = [*tokenize(reply), IM_END]  # a reply's special tokens are tokens
        return self._reply[min(self._next, len(self._reply) - 1)]

    def sample(self, batch_index: int) -> int:
        token = self._expected(batch_index)
        self._model.chosen[batch_index] = token
        self._next += 1
        return token

    def distribution(self, batch_index: int, limit: int) -> TokenDistribution | None:
        return None  # greedy: speculation verifies drafts against `sample`

    def accept(self, token: int) -> None:
        if self._reply is not None and token == self._reply[min(self._next, len(self._reply) - 1)]:
            self._next += 1

    def close(self) -> None:
        pass


@dataclass
class ScriptedModel:
    """The StrategyModel (see the module docstring)."""

    config: ModelConfig
    script: Script
    info: ModelInfo = field(init=False)
    # The token a sampler chose at each logits row of the last decode (for `logprobs`).
    chosen: dict[int, int] = field(default_factory=dict)
    decodes: int = 0
    closed: bool = False

    def __post_init__(self) -> None:
        ctx = self.config.context_window or min(
            self.script.context_length, self.config.context_default or self.script.context_length
        )
        self.info = ModelInfo(
            id=self.config.id,
            path=str(self.config.model_path),
            architecture=ARCHITECTURE,
            n_ctx_train=self.script.context_length,
            n_ctx_per_seq=ctx,
            n_seq_max=self.config.n_seq_max,
            n_vocab=N_VOCAB,
            bos_token=SPECIALS[BOS],
            eos_token=SPECIALS[IM_END],
            chat_template=CHATML,
            fim=FIM if self.script.fim else None,
        )
        self._kv: dict[int, list[int]] = {seq: [] for seq in range(self.config.n_seq_max)}
        self._rows: list[int] = []  # seq_id of each row of the last decode, -1: no logits
        # Decodes allowed while paused (None: not paused), and whether one waits for that.
        self._gate = threading.Condition()
        self._allowed: int | None = None
        self.held = False

    # ---- what tests use -----------------------------------------------------------

    def sequence(self, seq_id: int) -> list[int]:
        """The token ids sequence `seq_id` holds, in position order."""
        return list(self._kv[seq_id])

    def row(self, batch_index: int) -> int:
        """The sequence of a logits row of the last decode."""
        if not 0 <= batch_index < len(self._rows) or self._rows[batch_index] < 0:
            raise KronkError(f"scripted model: no logits at batch row {batch_index}")
        return self._rows[batch_index]

    def pause(self) -> None:
        """Hold every decode (the engine thread waits in `decode`, `held` is true) until
        `allow` lets some through or `resume` all."""
        with self._gate:
            self._allowed = 0

    def allow(self, decodes: int = 1) -> None:
        """While paused: let this many more decodes run."""
        with self._gate:
            self._allowed = (self._allowed or 0) + decodes
            self._gate.notify_all()

    def resume(self) -> None:
        with self._gate:
            self._allowed = None
            self._gate.notify_all()

    def _wait_turn(self) -> None:
        with self._gate:
            self.held = True
            self._gate.wait_for(lambda: self._allowed != 0 or self.closed)
            self.held = False
            if self._allowed:
                self._allowed -= 1

    # ---- TextModel and StrategyModel -----------------------------------------------

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return tokenize(text, add_special=add_special, parse_special=parse_special)

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        return token_bytes(token, special=special)

    def token_text(self, token: int) -> str:
        return token_bytes(token, special=True).decode("utf-8", "replace")

    def is_end_of_generation(self, token: int) -> bool:
        return token in (EOS, IM_END)

    def decode(self, batch: Batch) -> None:
        self._wait_turn()
        if self.script.decode_seconds:
            time.sleep(self.script.decode_seconds)
        if self.closed:
            raise BackendLostError("scripted model: decode after close")
        lengths = {seq: len(tokens) for seq, tokens in self._kv.items()}
        for position, seq_id in zip(batch.positions, batch.seq_ids, strict=True):
            if seq_id not in lengths:
                raise KronkError(f"scripted model: no sequence {seq_id}")
            if position != lengths[seq_id]:
                raise KronkError(
                    f"scripted model: position {position} of sequence {seq_id}, "
                    f"which holds {lengths[seq_id]} tokens"
                )
            if position >= self.info.n_ctx_per_seq:
                raise KronkError(f"scripted model: sequence {seq_id} is full")
            lengths[seq_id] += 1
        for token, seq_id in zip(batch.tokens, batch.seq_ids, strict=True):
            self._kv[seq_id].append(token)
        rows = zip(batch.seq_ids, batch.logits, strict=True)
        self._rows = [seq_id if want else -1 for seq_id, want in rows]
        self.chosen = {}
        self.decodes += 1

    def synchronize(self) -> None:
        pass

    def logprobs(self, batch_index: int, token: int, top_n: int) -> TokenLogprob:
        chosen = self.chosen.get(batch_index, IM_END)
        rest = math.log((1 - _CHOSEN) / (N_VOCAB - 1))

        def logprob(candidate: int) -> float:
            return math.log(_CHOSEN) if candidate == chosen else rest

        def entry(candidate: int) -> TopLogprob:
            text = self.token_text(candidate)
            return TopLogprob(text, logprob(candidate), tuple(text.encode()))

        others = [candidate for candidate in range(N_VOCAB) if candidate != chosen]
        top = tuple(entry(candidate) for candidate in [chosen, *others][:top_n])
        text = self.token_text(token)
        return TokenLogprob(text, logprob(token), tuple(text.encode()), top)

    def compile_stages(self, stages: Sequence[SamplerStage]) -> list[SamplerStage]:
        if any(isinstance(stage, GRAMMAR_STAGES) for stage in stages):
            raise InvalidRequestError("the scripted model does not follow grammars")
        return list(stages)

    def new_sampler(
        self, stages: Sequence[SamplerStage], *, seq_id: int | None = None, logits: bool = True
    ) -> ScriptedSampler:
        self.compile_stages(stages)
        return ScriptedSampler(self)

    def seq_remove(self, seq_id: int, start: int, end: int) -> bool:
        tokens = self._kv[seq_id]
        if end != -1 and end < len(tokens):
            return False  # a cut in the middle would leave a gap in the positions
        del tokens[start:]
        return True

    def seq_copy(self, src: int, dst: int, start: int, end: int) -> None:
        source, target = self._kv[src], self._kv[dst]
        end = len(source) if end == -1 else min(end, len(source))
        if len(target) != start:
            raise KronkError(
                f"scripted model: copying positions {start}-{end} of sequence {src} into "
                f"sequence {dst}, which holds {len(target)} tokens"
            )
        target.extend(source[start:end])

    def seq_state(self, seq_id: int) -> bytes:
        return json.dumps(self._kv[seq_id]).encode()

    def set_seq_state(self, seq_id: int, state: bytes) -> int:
        try:
            tokens = [int(token) for token in json.loads(state)]
        except (ValueError, TypeError):
            return 0
        self._kv[seq_id] = tokens
        return len(state)

    def trim_floor(self, seq_id: int) -> int:
        return 0

    def checkpoint(self, seq_id: int) -> bytes:
        return b""  # every position can be cut back: no state beyond the tokens

    def restore_checkpoint(self, seq_id: int, length: int, state: bytes) -> bool:
        return length <= len(self._kv[seq_id]) and self.seq_remove(seq_id, length, -1)

    def close(self) -> None:
        with self._gate:
            self.closed = True
            self._gate.notify_all()
        for tokens in self._kv.values():
            tokens.clear()


class ScriptedBackend:
    def load_model(self, config: ModelConfig) -> ScriptedModel:
        assert config.model_path is not None
        return ScriptedModel(config, Script.read(config.model_path))

    def model_file(self, path: Path) -> ModelFile | None:
        return None

    def packaged_models(self) -> Sequence[PackagedModel]:
        return ()

    def devices(self) -> Sequence[Device]:
        return ()

    def memory_estimate(self, config: ModelConfig) -> MemoryEstimate | None:
        return None

    def model_facts(self, config: ModelConfig) -> ModelFacts | None:
        return None


@hookimpl
def kronk_register_backends(register: Register[Backend]) -> None:
    register(BACKEND, ScriptedBackend())
