"""Hook implementations of the debug plugin."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pluggy
from litestar import Litestar, Request, Response, get
from litestar.config.app import AppConfig

from kronk_api.contract import ADMIN, ENDPOINT_OPT, announce
from kronk_core import Kronk, hookimpl
from kronk_core.contract import (
    ChatRecord,
    KronkView,
    ModelConfig,
    NotFoundError,
    Section,
    Subscription,
)
from kronk_debug import hookspecs
from kronk_debug.metrics import Metrics, current_labels
from kronk_debug.middleware import STATE_KEY, count_requests
from kronk_debug.profiling import LagMonitor
from kronk_debug.server import PROMETHEUS_TEXT, DebugServer, debug_app, is_loopback
from kronk_debug.settings import SETTINGS

log = logging.getLogger(__name__)


class MetricsObserver:
    """Registered with a server's plugin manager while it runs: feeds its Metrics."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    @hookimpl
    def kronk_chat_finished(self, record: ChatRecord) -> None:
        labels = current_labels.get()
        if labels is None or labels.metrics is not self.metrics:
            return  # not a request this server answered
        labels.model = record.model
        labels.failed = record.finish_reason == "error"
        self.metrics.observe_chat(record, labels.endpoint)

    @hookimpl
    def kronk_model_loaded(self, model_config: ModelConfig, seconds: float) -> None:
        labels = current_labels.get()
        if labels is None or labels.metrics is self.metrics:
            self.metrics.observe_load(model_config.id, seconds)


@dataclass
class DebugState:
    metrics: Metrics
    # The MetricsObserver, subscribed to the hook calls while the server runs.
    observer: Subscription
    monitor: LagMonitor
    server: DebugServer


@hookimpl
def kronk_addhooks(plugin_manager: pluggy.PluginManager) -> None:
    plugin_manager.add_hookspecs(hookspecs)


@hookimpl
def kronk_settings() -> Sequence[Section[Any]]:
    return [SETTINGS]


# Last: its lifespan starts once every other plugin's has (a failing one stops the server
# first), and stops first.
@hookimpl(trylast=True)
def kronk_app(app_config: AppConfig, kronk: KronkView) -> None:
    app_config.middleware.append(count_requests)
    app_config.route_handlers.append(api_metrics)

    @asynccontextmanager
    async def debug_server(app: Litestar) -> AsyncIterator[None]:
        state = _start(kronk, app)
        try:
            yield
        finally:
            if state is not None:
                state.monitor.stop()
                state.server.stop()
                state.observer.cancel()

    app_config.lifespan.append(debug_server)


@get("/metrics", opt={ENDPOINT_OPT: ADMIN}, include_in_schema=False)
async def api_metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    """The debug server's /metrics on the API port, with debug.api_metrics on."""
    state: DebugState | None = request.app.state.get(STATE_KEY)
    if state is None or not SETTINGS.of(request.app.state.settings).api_metrics:
        raise NotFoundError(
            "/metrics is served on the debug server's port; start with --metrics "
            "(debug.api_metrics) to serve it on this port too"
        )
    return Response(state.metrics.exposition(), media_type=PROMETHEUS_TEXT)


def _start(kronk: KronkView, app: Litestar) -> DebugState | None:
    """The metrics, the loop-lag monitor and the debug server, when the plugin is on."""
    settings = SETTINGS.of(app.state.settings)
    if not settings.enabled:
        return None
    # The metrics read the loaded models' engines: the server's SDK facade.
    sdk: Kronk = app.state.kronk
    metrics = Metrics(sdk)
    for collectors in kronk.hook.kronk_debug_collectors(kronk=sdk):
        for collector in collectors:
            metrics.registry.register(collector)
    # Models loaded before the server started (--preload) count as loads too.
    for entry in kronk.pool.entries():
        metrics.observe_load(entry.model_id, entry.load_seconds)
    host, _, port = settings.host.rpartition(":")
    guards: list[Any] = []
    if not is_loopback(host):
        guards = list(app.guards)
        log.warning(
            "the debug server listens on %s, off loopback: with auth on it needs admin "
            "tokens, without auth anyone who reaches it can read stacks and profiles",
            settings.host,
        )
    loop = asyncio.get_running_loop()
    server = DebugServer(debug_app(metrics, loop, app.state, guards), host, int(port))
    observer = kronk.subscribe(MetricsObserver(metrics))
    monitor = LagMonitor(metrics.event_loop_lag.observe)
    monitor.start()
    if server.start():
        announce(app, "debug", f"http://{server.url_host}")
    state = app.state[STATE_KEY] = DebugState(metrics, observer, monitor, server)
    return state
