"""Vocabulary helpers shared by text and embedding models (reads only the vocab: any thread)."""

from __future__ import annotations

import llama_cpp


def tokenize(
    vocab: llama_cpp.llama_vocab_p, text: str, *, add_special: bool, parse_special: bool
) -> list[int]:
    data = text.encode("utf-8")
    capacity = len(data) + 8
    while True:
        buffer = (llama_cpp.llama_token * capacity)()
        count = llama_cpp.llama_tokenize(
            vocab, data, len(data), buffer, capacity, add_special, parse_special
        )
        if count >= 0:
            return list(buffer[:count])
        capacity = -count
