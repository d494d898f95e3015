"""Token keys for the host tier's stores."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kronk_core.contract import Adapters


def token_key(tokens: Sequence[int], adapters: Adapters = ()) -> bytes:
    """A compact exact key for a token sequence decoded under these LoRA adapters (used
    for hashing into stores); without adapters, the tokens' bytes alone."""
    key = np.asarray(tokens, dtype=np.int32).tobytes()
    return key + repr(adapters).encode() if adapters else key
