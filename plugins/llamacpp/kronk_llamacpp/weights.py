"""Loading GGUF weights and reading their metadata (shared by text and embedding models)."""

from __future__ import annotations

import ctypes

import llama_cpp

from kronk_core.contract import ModelConfig, ModelLoadError
from kronk_llamacpp.library import ensure_initialised
from kronk_llamacpp.params import model_params

_SKIPPED_METADATA = (
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.chat_template",
)


def load_weights(config: ModelConfig) -> llama_cpp.llama_model_p:
    ensure_initialised()
    path = config.model_path
    if path is None or not path.is_file():
        raise ModelLoadError(f"model_path: file not found: {path}")
    weights = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params(config))
    if not weights:
        raise ModelLoadError(f"model_path: llama.cpp could not load {path} (not a valid GGUF?)")
    return weights


def metadata(model: llama_cpp.llama_model_p) -> dict[str, str]:
    key = ctypes.create_string_buffer(256)
    value = ctypes.create_string_buffer(1024)
    found: dict[str, str] = {}
    for index in range(llama_cpp.llama_model_meta_count(model)):
        llama_cpp.llama_model_meta_key_by_index(model, index, key, len(key))
        name = key.value.decode("utf-8", errors="replace")
        if name in _SKIPPED_METADATA:
            continue
        llama_cpp.llama_model_meta_val_str_by_index(model, index, value, len(value))
        found[name] = value.value.decode("utf-8", errors="replace")
    return found
