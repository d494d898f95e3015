"""Token-prefix arithmetic shared by the strategies."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def common_prefix(cached: Sequence[int], prompt: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    size = min(len(cached), len(prompt))
    if size == 0:
        return 0
    a = np.asarray(cached[:size], dtype=np.int64)
    b = np.asarray(prompt[:size], dtype=np.int64)
    differ = np.flatnonzero(a != b)
    return int(differ[0]) if differ.size else size


def token_key(tokens: Sequence[int]) -> bytes:
    """A compact exact key for a token sequence (used for hashing into stores)."""
    return np.asarray(tokens, dtype=np.int32).tobytes()
