"""Token-sequence arithmetic that cache and draft strategies share."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences.

    A binary search over slice comparisons: each comparison runs at C speed, so a
    conversation of thousands of tokens costs a dozen of them, not a Python loop.
    """
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if list(a[:middle]) == list(b[:middle]):
            low = middle
        else:
            high = middle - 1
    return low
