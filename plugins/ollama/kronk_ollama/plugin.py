"""Hook implementations of the Ollama dialect plugin."""

from __future__ import annotations

from collections.abc import Sequence

from litestar.types import ControllerRouterHandler

from kronk_core import Kronk, hookimpl
from kronk_ollama.routes import router


@hookimpl
def kronk_routes(kronk: Kronk) -> Sequence[ControllerRouterHandler]:
    return [router()]
