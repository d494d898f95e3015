"""Hook implementations of the embeddings plugin."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kronk_core import Kronk, hookimpl
from kronk_embeddings.routes import router


@hookimpl
def kronk_routes(kronk: Kronk) -> Sequence[Any]:
    return [router()]
