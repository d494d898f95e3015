"""What the dashboard's live charts read besides the engines' counters: chats finished and
their times to first token, counted since the server started (GET /v1/kronk/ui/live).

The charts take differences between two reads, so a count and a sum are all they need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar import Request, get

from kronk_api.contract import ADMIN, ENDPOINT_OPT
from kronk_core import hookimpl
from kronk_core.contract import ChatRecord

STATE_KEY = "kronk_ui_live"


@dataclass(eq=False)
class LiveCounts:
    """Registered with a server's plugin manager while it runs (one per server)."""

    chats: int = 0
    ttft_count: int = 0
    ttft_seconds: float = 0.0

    @hookimpl
    def kronk_chat_finished(self, record: ChatRecord) -> None:
        self.chats += 1
        run = record.generation
        if run is not None and run.first_token_at:
            self.ttft_count += 1
            self.ttft_seconds += run.first_token_at - record.started_at


@get("/v1/kronk/ui/live", opt={ENDPOINT_OPT: ADMIN})
async def live(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The browser UI's live counters: chats served and their time to first token."""
    counts: LiveCounts = request.app.state[STATE_KEY]
    return {
        "chats": counts.chats,
        "ttft_count": counts.ttft_count,
        "ttft_seconds": counts.ttft_seconds,
    }
