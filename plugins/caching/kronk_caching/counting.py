"""Cache counters kept by a strategy."""

from __future__ import annotations

from dataclasses import replace

from kronk_core.contract import CacheCounters


class Counted:
    """Mixin: `counters()` for the CacheStrategy protocol, `_count(**deltas)` to add to them."""

    _counters = CacheCounters()

    def counters(self) -> CacheCounters:
        return self._counters

    def _count(self, **deltas: int) -> None:
        current = self._counters
        self._counters = replace(
            current, **{name: getattr(current, name) + value for name, value in deltas.items()}
        )
