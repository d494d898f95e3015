"""Hook implementations of the Anthropic dialect plugin."""

from __future__ import annotations

from collections.abc import Sequence

from litestar.types import ControllerRouterHandler

from kronk_anthropic.routes import router
from kronk_core import Kronk, hookimpl


@hookimpl
def kronk_routes(kronk: Kronk) -> Sequence[ControllerRouterHandler]:
    return [router()]
