"""Token keys for the host tier's stores."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def token_key(tokens: Sequence[int]) -> bytes:
    """A compact exact key for a token sequence (used for hashing into stores)."""
    return np.asarray(tokens, dtype=np.int32).tobytes()
