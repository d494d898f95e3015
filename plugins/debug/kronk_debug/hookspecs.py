"""The hook the debug plugin defines for other plugins (added through kronk_addhooks)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from kronk_core.contract import Kronk

hookspec = pluggy.HookspecMarker("kronk")


@hookspec
def kronk_debug_collectors(kronk: Kronk) -> Sequence[Collector]:
    """Return prometheus_client collectors to add to the debug server's /metrics.

    Called once when the debug server starts. A collector's `collect()` runs
    on every scrape, on the debug server's thread: read your figures there.
    Mark the hookimpl `optionalhook=True`. (Drafted tokens need none: the
    debug plugin counts a request's `Usage.accepted_prediction_tokens` and
    `rejected_prediction_tokens`.)
    """
