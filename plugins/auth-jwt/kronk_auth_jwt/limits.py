"""The rate-limit counter store protocol, and what `kronk_register_limit_stores` registers."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class LimitStore(Protocol):
    """Counters of requests per key, shared by every server that opens the same store.

    A key names one token subject, one endpoint and one window
    (e.g. `"5f0c…:chat-completions:day:2025-01-31"`), so a new window is a new key
    and old keys are never reset, only expired.
    """

    async def acquire(self, key: str, limit: int, expires_at: float) -> bool:
        """Count one request on `key` if fewer than `limit` are counted; say whether it was.

        Check and increment must be one atomic step across every process that
        shares the store: of N concurrent calls on a fresh key, exactly
        `min(N, limit)` return True. `expires_at` (Unix time) is when the key's
        window ends; the store may forget the key after it.
        """
        ...

    def close(self) -> None:
        """Release connections; called once when the server shuts down."""
        ...


class LimitStoreFactory(Protocol):
    """Opens the store a `limit_store` URL names (its scheme is the registered name)."""

    def __call__(self, url: str, base_path: Path) -> LimitStore:
        """`url` is the whole setting (`sqlite`, `sqlite:///PATH`, `redis://HOST:PORT/DB`);
        `base_path` the server's data directory. Raise ConfigError for a URL it cannot use."""
        ...
