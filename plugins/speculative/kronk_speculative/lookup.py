"""Prompt lookup: draft the continuation of the latest earlier occurrence of the last tokens.

No second model: the slot's own context (prompt and generated text) is the
draft source. When an answer quotes its prompt (code being edited, a
document being cited), the tokens after an earlier occurrence of the last few
tokens are very likely what comes next.
"""

from __future__ import annotations

from collections.abc import Sequence

from kronk_core.contract import Draft, DraftRequest


class NgramIndex:
    """Where each n-gram of a token sequence last occurred, by the position that followed it.

    Grows as the sequence grows; an n-gram is indexed once a token follows it,
    so the sequence's own last n-gram is found only where it occurred before.
    """

    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        self.tokens: list[int] = []
        self._sizes = range(ngram_max, ngram_min - 1, -1)
        self._next: dict[tuple[int, ...], int] = {}

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            end = len(self.tokens)
            for size in self._sizes:
                if size <= end:
                    self._next[tuple(self.tokens[end - size : end])] = end
            self.tokens.append(token)

    def continuation(self, count: int) -> list[int]:
        """Up to `count` tokens that followed the longest n-gram matching the sequence's end."""
        end = len(self.tokens)
        for size in self._sizes:
            if size > end:
                continue
            start = self._next.get(tuple(self.tokens[end - size : end]))
            if start is not None:
                return self.tokens[start : start + count]
        return []


class PromptLookup:
    """The `lookup` draft strategy: one n-gram index per slot, kept in step with its context."""

    name = "lookup"
    # A slot's draft is a function of its context: the same request drafts the same again.
    reproducible = True

    def __init__(
        self, *, ndraft: int, ngram_min: int, ngram_max: int, adaptive: bool = True
    ) -> None:
        self.ndraft = ndraft
        self.adaptive = adaptive
        self._ngram_min = ngram_min
        self._ngram_max = ngram_max
        self._indexes: dict[int, NgramIndex] = {}

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        return [
            Draft(tuple(self._index(request).continuation(request.max_tokens)))
            for request in requests
        ]

    def _index(self, request: DraftRequest) -> NgramIndex:
        """The slot's index, extended by what was appended since, or rebuilt when the context
        is another one (a new conversation in the slot, or a cut)."""
        context = request.context
        index = self._indexes.get(request.slot_id)
        if index is None or list(context[: len(index.tokens)]) != index.tokens:
            index = self._indexes[request.slot_id] = NgramIndex(self._ngram_min, self._ngram_max)
        index.extend(context[len(index.tokens) :])
        return index

    def close(self) -> None:
        self._indexes.clear()
