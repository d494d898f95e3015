"""Vocabulary helpers shared by text and embedding models (reads only the vocab: any thread)."""

from __future__ import annotations

import llama_cpp

from kronk_core.contract import InvalidRequestError


def utf8(text: str, what: str) -> bytes:
    """The text as UTF-8; a lone surrogate (which JSON's `\\ud800` decodes to) is the caller's
    error, not the server's."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(
            f"{what} is not valid Unicode: it holds the lone surrogate {text[exc.start]!r} "
            f"at character {exc.start}"
        ) from None


def tokenize(
    vocab: llama_cpp.llama_vocab_p, text: str, *, add_special: bool, parse_special: bool
) -> list[int]:
    data = utf8(text, "the text")
    capacity = len(data) + 8
    while True:
        buffer = (llama_cpp.llama_token * capacity)()
        count = llama_cpp.llama_tokenize(
            vocab, data, len(data), buffer, capacity, add_special, parse_special
        )
        if count >= 0:
            return list(buffer[:count])
        capacity = -count
