"""The debug server: its own HTTP server on its own thread and event loop.

Own thread, so its endpoints answer while the API's event loop is stuck (when
thread stacks matter most). Never on the API port.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import threading
from collections.abc import Sequence
from dataclasses import asdict
from importlib.resources import files
from typing import Annotated, Any

import uvicorn
from litestar import Litestar, Response, get
from litestar.datastructures import State
from litestar.params import Parameter
from litestar.types import Guard

from kronk_api.contract import ADMIN, ENDPOINT_OPT, PUBLIC, SERVER_DIALECT, ListenError, listen
from kronk_debug.metrics import Metrics
from kronk_debug.profiling import (
    Exclusive,
    allocation_top,
    cpu_profile,
    probe_loop_lag,
    process_figures,
    thread_stacks,
)

log = logging.getLogger(__name__)

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
_OPT = {ENDPOINT_OPT: ADMIN}
_CPU = Exclusive("CPU")
_MEMORY = Exclusive("memory")
PAGE = files("kronk_debug").joinpath("page.html")
INDEX = """Kronk debug server
/metrics                                 Prometheus metrics
/debug/threads                           every thread's stack
/debug/profile?seconds=30&interval_ms=10 sampled CPU profile, folded stacks (flame graphs)
/debug/memory?seconds=10&limit=25        allocation sites of the next N seconds (tracemalloc)
/debug/loop-lag?seconds=1                how late the API event loop runs callbacks
/debug/process                           memory, CPU time, threads and loop lag now (JSON)
/debug/view                              a page of all these: live charts, profiles, stacks
"""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _text(body: str) -> Response[str]:
    return Response(body, media_type="text/plain; charset=utf-8")


def debug_app(
    metrics: Metrics, api_loop: asyncio.AbstractEventLoop, state: State, guards: Sequence[Guard]
) -> Litestar:
    """The debug routes; `state` is the API server's, so its guards work here too."""

    @get("/metrics", opt=_OPT)
    async def scrape() -> Response[bytes]:
        return Response(metrics.exposition(), media_type=PROMETHEUS_TEXT)

    @get(["/debug", "/debug/"], opt=_OPT)
    async def index() -> Response[str]:
        return _text(INDEX)

    @get("/debug/threads", opt=_OPT)
    async def threads() -> Response[str]:
        return _text(thread_stacks())

    @get("/debug/profile", opt=_OPT)
    async def profile(
        seconds: Annotated[float, Parameter(gt=0, le=300)] = 30.0,
        interval_ms: Annotated[float, Parameter(ge=1, le=1000)] = 10.0,
    ) -> Response[str]:
        work = lambda: cpu_profile(seconds, interval_ms / 1000)  # noqa: E731
        return _text(await asyncio.to_thread(_CPU.run, work))

    @get("/debug/memory", opt=_OPT)
    async def memory(
        seconds: Annotated[float, Parameter(gt=0, le=300)] = 10.0,
        limit: Annotated[int, Parameter(ge=1, le=1000)] = 25,
    ) -> Response[str]:
        work = lambda: allocation_top(seconds, limit)  # noqa: E731
        return _text(await asyncio.to_thread(_MEMORY.run, work))

    @get("/debug/process", opt=_OPT)
    async def process() -> dict[str, Any]:
        return asdict(await asyncio.to_thread(process_figures, api_loop))

    @get("/debug/view", opt={ENDPOINT_OPT: PUBLIC})
    async def view() -> Response[bytes]:
        """The page: no data of its own, every figure it shows it fetches with the token
        the user gives it, as the routes above want."""
        return Response(PAGE.read_bytes(), media_type="text/html; charset=utf-8")

    @get("/debug/loop-lag", opt=_OPT)
    async def loop_lag(
        seconds: Annotated[float, Parameter(gt=0, le=60)] = 1.0,
        interval_ms: Annotated[float, Parameter(ge=1, le=1000)] = 10.0,
    ) -> dict[str, Any]:
        lag = await asyncio.to_thread(probe_loop_lag, api_loop, seconds, interval_ms / 1000)
        return asdict(lag)

    return Litestar(
        route_handlers=[scrape, index, threads, profile, memory, process, view, loop_lag],
        guards=list(guards),
        exception_handlers=SERVER_DIALECT.exception_handlers(),
        state=state,
        openapi_config=None,
        logging_config=None,
    )


class DebugServer:
    """uvicorn on a socket bound before its thread starts: requests queue until it serves."""

    def __init__(self, app: Litestar, host: str, port: int) -> None:
        self.address = (host, port)
        # No log settings at all: uvicorn's are process-wide, and the API server's (JSON,
        # its level, its access log) stay in charge. Debug requests are access-logged too.
        config = uvicorn.Config(app, log_config=None, log_level=None, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Bind and serve; False (and an error logged) when the address cannot be bound."""
        host, port = self.address
        try:
            sock = listen(host.strip("[]"), port)
        except ListenError as exc:
            log.error("debug server not started: %s", exc.message)
            return False
        self.address = (host, sock.getsockname()[1])
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="kronk-debug", daemon=True
        )
        self._thread.start()
        log.debug("debug server on http://%s", self.url_host)
        return True

    @property
    def url_host(self) -> str:
        """HOST:PORT as a URL writes it (the port it bound)."""
        host, port = self.address
        return f"{host}:{port}"

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
