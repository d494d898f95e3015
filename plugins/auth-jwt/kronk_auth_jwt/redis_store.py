"""Rate-limit counters in Redis, for several servers that share their limits."""

from __future__ import annotations

import asyncio
import logging
import math

import redis

from kronk_core.contract import KronkError

# Check and increment in one script: Redis runs a script atomically, so servers never
# both take the last unit of a quota.
_ACQUIRE = """
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
if count >= tonumber(ARGV[1]) then
    return 0
end
redis.call('INCR', KEYS[1])
redis.call('EXPIREAT', KEYS[1], ARGV[2])
return 1
"""
_PREFIX = "kronk:limit:"

log = logging.getLogger(__name__)


class LimitStoreUnavailable(KronkError):
    """The counters cannot be reached; requests that need them are refused, not let through."""

    status = 503
    code = "unavailable"


class RedisLimitStore:
    def __init__(self, url: str) -> None:
        self._redis = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self._script = self._redis.register_script(_ACQUIRE)

    async def acquire(self, key: str, limit: int, expires_at: float) -> bool:
        return await asyncio.to_thread(self._acquire, key, limit, expires_at)

    def _acquire(self, key: str, limit: int, expires_at: float) -> bool:
        try:
            taken = self._script(keys=[_PREFIX + key], args=[limit, math.ceil(expires_at)])
        except redis.RedisError as exc:
            log.error("rate-limit store failed: %s", exc)  # its address stays in the log
            raise LimitStoreUnavailable(
                "the rate-limit store is unavailable; retry later"
            ) from None
        return bool(taken)

    def close(self) -> None:
        self._redis.close()
