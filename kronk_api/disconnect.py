"""Stop work for a client that went away before its response started."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from litestar import Request

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection; whatever was awaited has been cancelled."""


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request[Any, Any, Any], work: Awaitable[T]) -> T:
    """Await work (the body must already be read); cancel it if the client leaves first.

    uvicorn does not cancel a handler when its client disconnects, so without
    this a non-streaming generation would run to max_tokens for nobody.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    raise ClientDisconnected
