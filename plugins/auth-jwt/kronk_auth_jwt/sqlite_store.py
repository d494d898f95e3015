"""Rate-limit counters in SQLite: one file, kept across restarts, shared by local servers."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS counters (
    key TEXT PRIMARY KEY,
    count INTEGER NOT NULL,
    expires_at REAL NOT NULL
)
"""
# One statement, so check and increment are one atomic write even across processes:
# the update happens only while count < limit, and RETURNING yields no row otherwise.
_ACQUIRE = """
INSERT INTO counters (key, count, expires_at) VALUES (?, 1, ?)
ON CONFLICT (key) DO UPDATE SET count = count + 1 WHERE count < ?
RETURNING count
"""


class SqliteLimitStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit; another process holding the write lock is waited for, not an error.
        self._db = sqlite3.connect(path, isolation_level=None, timeout=30, check_same_thread=False)
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(_SCHEMA)
        self._db.execute("DELETE FROM counters WHERE expires_at < ?", (time.time(),))

    async def acquire(self, key: str, limit: int, expires_at: float) -> bool:
        if limit < 1:
            return False
        return await asyncio.to_thread(self._acquire, key, limit, expires_at)

    def _acquire(self, key: str, limit: int, expires_at: float) -> bool:
        with self._lock:  # one connection, used by one thread at a time
            rows = self._db.execute(_ACQUIRE, (key, expires_at, limit)).fetchall()
        return bool(rows)

    def close(self) -> None:
        with self._lock:
            self._db.close()
