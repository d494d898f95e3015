"""Hook implementations of the Anthropic dialect plugin."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kronk_anthropic.routes import router
from kronk_core import Kronk, hookimpl


@hookimpl
def kronk_routes(kronk: Kronk) -> Sequence[Any]:
    return [router()]
