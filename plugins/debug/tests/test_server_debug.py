"""The debug server (the debug plugin) next to a real API server: /metrics scraped over
HTTP and parsed with Prometheus' own text parser, the profiling endpoints, and who may
reach them."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from litestar import get
from litestar.config.app import AppConfig
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from kronk_api import ServerSettings, create_app
from kronk_api.endpoints import ENDPOINT_OPT, PUBLIC
from kronk_core import Kronk, KronkConfig, ModelConfig, hookimpl
from kronk_llamacpp.packaged import GEMMA_MODEL_ID, GEMMA_MODEL_SETTINGS
from kronk_testing.waiting import gated, reached

# Real models throughout: the full tier (docs/testing.md).
pytestmark = pytest.mark.model

if TYPE_CHECKING:
    from kronk_testing.server import Serve

DOCS_DIR = Path(__file__).parents[3] / "docs"
DOCS = (DOCS_DIR / "observability.md").read_text(encoding="utf-8")
DASHBOARD = json.loads((DOCS_DIR / "grafana" / "kronk-dashboard.json").read_text(encoding="utf-8"))
CHAT = "chat-completions"
SYSTEM = {"role": "system", "content": "You answer in one short sentence. " * 40}
OPENING = [SYSTEM, {"role": "user", "content": "Count from one to ten."}]


def body(messages: list[dict[str, str]]) -> dict[str, Any]:
    return {"model": GEMMA_MODEL_ID, "messages": messages, "max_tokens": 4, "temperature": 0}


class LoopBlocker:
    """A route that blocks the API's event loop (as a careless handler would) until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    @hookimpl
    def kronk_app(self, app_config: AppConfig) -> None:
        blocker = self

        @get("/probe/block-loop", opt={ENDPOINT_OPT: PUBLIC})
        async def block_the_loop() -> str:
            blocker.entered.set()
            blocker.release.wait(60)  # synchronous on purpose: nothing else runs on the loop
            return "released"

        app_config.route_handlers.append(block_the_loop)


@dataclass
class DebugServer:
    api: str
    debug: str
    blocker: LoopBlocker
    kronk: Kronk


def kronk_config(base: Path) -> KronkConfig:
    model = {**GEMMA_MODEL_SETTINGS, "context_window": 2048, "n_seq_max": 2}
    return KronkConfig(
        base_path=base,
        default_model=GEMMA_MODEL_ID,
        models={GEMMA_MODEL_ID: ModelConfig.model_validate(model)},
    )


class SlotsPerModel:
    """A collector another plugin adds through kronk_debug_collectors."""

    def __init__(self, kronk: Kronk) -> None:
        self.kronk = kronk

    def describe(self) -> list[Metric]:
        return [GaugeMetricFamily("kronk_probe_models", "Loaded chat models")]

    def collect(self) -> list[Metric]:
        return [
            GaugeMetricFamily(
                "kronk_probe_models", "Loaded chat models", len(self.kronk.loaded_models())
            )
        ]


class CollectorProbe:
    @hookimpl(optionalhook=True)
    def kronk_debug_collectors(self, kronk: Kronk) -> list[SlotsPerModel]:
        return [SlotsPerModel(kronk)]


@contextlib.contextmanager
def debug_server(
    serve: Serve, base: Path, debug_host: str, **settings: Any
) -> Iterator[DebugServer]:
    server = ServerSettings.model_validate(
        {
            "base_path": base,
            "model": GEMMA_MODEL_ID,
            "preload": True,
            "debug": {"host": debug_host},
            **settings,
        }
    )
    blocker = LoopBlocker()
    kronk = Kronk(kronk_config(base), plugins={"probe": CollectorProbe(), "blocker": blocker})
    app = create_app(server, kronk=kronk)
    with serve(app, lifespan="on") as api:
        debug_url = f"http://127.0.0.1:{debug_host.rpartition(':')[2]}"
        yield DebugServer(api, debug_url, blocker, kronk)


@pytest.fixture(scope="module")
def debug(
    serve: Serve, tmp_path_factory: pytest.TempPathFactory, port_finder: Callable[[], int]
) -> Iterator[DebugServer]:
    base = tmp_path_factory.mktemp("debug-server")
    with debug_server(serve, base, f"127.0.0.1:{port_finder()}") as server:
        yield server


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(server: DebugServer) -> Samples:
    answer = httpx.get(f"{server.debug}/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def chat(server: DebugServer, payload: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.api}/v1/chat/completions", json=payload, timeout=120)


def test_metrics_count_known_requests(debug: DebugServer) -> None:
    before = scrape(debug)
    first = chat(debug, body(OPENING)).json()
    reply = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
    second = chat(debug, body([*OPENING, reply, {"role": "user", "content": "Go on."}])).json()
    streamed = {**body(OPENING), "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{debug.api}/v1/chat/completions", json=streamed) as response:
        chunks = [line for line in response.iter_lines() if line.startswith("data: {")]
    third = httpx.Response(200, content=chunks[-1].removeprefix("data: ")).json()
    assert chat(debug, {**body(OPENING), "max_tokens": 0}).status_code == 400
    assert chat(debug, {**body(OPENING), "model": "no-such-model"}).status_code == 404
    after = scrape(debug)

    usages = [answer["usage"] for answer in (first, second, third)]
    cached = [usage.get("prompt_tokens_details", {}).get("cached_tokens", 0) for usage in usages]
    assert cached[1] > 0  # the second turn reused the first's KV (IMC)
    labels = {"endpoint": CHAT, "model": GEMMA_MODEL_ID}
    assert delta(before, after, "kronk_requests_total", **labels, code="200") == 3
    assert delta(before, after, "kronk_errors_total", **labels, code="200") == 0
    # Refused before a model was chosen: no model label.
    for code in ("400", "404"):
        assert delta(before, after, "kronk_requests_total", endpoint=CHAT, model="", code=code) == 1
        assert delta(before, after, "kronk_errors_total", endpoint=CHAT, model="", code=code) == 1
    tokens = {
        "kronk_prompt_tokens_total": sum(usage["prompt_tokens"] for usage in usages),
        "kronk_completion_tokens_total": sum(usage["completion_tokens"] for usage in usages),
        "kronk_cached_tokens_total": sum(cached),
        "kronk_reasoning_tokens_total": 0,
    }
    for name, expected in tokens.items():
        assert delta(before, after, name, **labels) == expected, name
    for histogram in (
        "kronk_request_duration_seconds",
        "kronk_prompt_creation_seconds",
        "kronk_queue_wait_seconds",
        "kronk_cache_seconds",
        "kronk_prefill_seconds",
        "kronk_time_to_first_token_seconds",
        "kronk_tokens_per_second",
    ):
        count = delta(before, after, f"{histogram}_count", **labels)
        assert count == 3, histogram
        assert delta(before, after, f"{histogram}_sum", **labels) > 0, histogram
        assert delta(before, after, f"{histogram}_bucket", **labels, le="+Inf") == count
    refused = delta(before, after, "kronk_request_duration_seconds_count", endpoint=CHAT, model="")
    assert refused == 2
    saved = delta(before, after, "kronk_cache_tokens_saved_total", model=GEMMA_MODEL_ID)
    assert saved == sum(cached)


# The manual's PromQL (§14.5), as printed there.
MANUAL_QUERIES = (
    "model_ttft_avg",
    "usage_tokens_per_second_avg",
    "rate(requests[5m])",
    "rate(errors[5m]) / rate(requests[5m])",
)


def test_the_manual_s_metric_names_answer_its_queries(debug: DebugServer) -> None:
    """The manual's unlabelled names: counts since start, and each figure's average, least
    and most over every request so far."""
    before = scrape(debug)
    answers = [chat(debug, body(OPENING)).json() for _ in range(2)]
    assert chat(debug, {**body(OPENING), "model": "no-such-model"}).status_code == 404
    after = scrape(debug)
    assert delta(before, after, "requests") == 3
    assert delta(before, after, "errors") == 1
    assert value(after, "panics") == 0 and value(after, "goroutines") >= 1
    totals = [answer["usage"]["total_tokens"] for answer in answers]
    assert value(after, "usage_total_tokens_max") >= max(totals)
    assert value(after, "usage_total_tokens_min") <= min(totals)
    for figure in ("model_ttft", "model_prefill", "model_prompt_creation", "model_load"):
        low, mean, high = (value(after, f"{figure}_{end}") for end in ("min", "avg", "max"))
        assert 0 < low <= mean <= high, figure
    assert value(after, "usage_tokens_per_second_avg") > 0
    assert value(after, "usage_output_tokens_avg") > 0
    series = {name for name, _ in after}
    for query in MANUAL_QUERIES:
        names = set(re.findall(r"\b[a-z_]+\b(?![(\[])", re.sub(r"\[5m\]", "", query)))
        assert names <= series, (query, sorted(names - series))


def test_engine_and_cache_gauges(debug: DebugServer) -> None:
    chat(debug, body(OPENING))
    samples = scrape(debug)
    model = {"model": GEMMA_MODEL_ID}
    assert value(samples, "kronk_slots", **model) == 2
    assert value(samples, "kronk_slots_active", **model) == 0
    assert value(samples, "kronk_queue_length", **model) == 0
    # IMC keeps the conversation in its slot.
    assert value(samples, "kronk_kv_cells_used", **model) > 0
    assert value(samples, "kronk_engine_generated_tokens_total", **model) > 0
    assert ("kronk_cache_host_bytes", frozenset(model.items())) in samples
    assert value(samples, "kronk_model_load_seconds_count", **model) == 1  # the preload
    assert value(samples, "kronk_model_load_seconds_sum", **model) > 0
    assert value(samples, "process_cpu_seconds_total") > 0
    # The lag monitor observes every half second: wait for its first observation.
    deadline = time.monotonic() + 30
    while value(samples, "kronk_event_loop_lag_seconds_count") == 0:
        assert time.monotonic() < deadline, "the lag monitor observed nothing"
        time.sleep(0.1)
        samples = scrape(debug)


def test_every_metric_is_documented(debug: DebugServer) -> None:
    answer = httpx.get(f"{debug.debug}/metrics").text
    families = {family.name for family in text_string_to_metric_families(answer)}
    # prometheus-client adds a `_created` timestamp series to every counter and histogram.
    kronk_families = {
        name for name in families if name.startswith("kronk_") and not name.endswith("_created")
    }
    assert len(kronk_families) > 20
    kronk_families.discard("kronk_probe_models")  # the test's own collector
    missing = {name for name in kronk_families if f"`{name}" not in DOCS}
    assert not missing, f"docs/observability.md must describe {sorted(missing)}"


def test_the_dashboard_queries_metrics_that_exist(debug: DebugServer) -> None:
    answer = httpx.get(f"{debug.debug}/metrics").text
    families = list(text_string_to_metric_families(answer))
    series = {sample.name for family in families for sample in family.samples}
    queried = {
        name
        for panel in DASHBOARD["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bkronk_\w+", target["expr"])
    }
    assert len(queried) > 15
    # Series that appear once a speculative plugin drafts (plugins/debug/tests show them).
    drafted = {"kronk_speculative_accepted_tokens_total", "kronk_speculative_rejected_tokens_total"}
    assert drafted <= queried and all(f"`{name}`" in DOCS for name in drafted)
    assert queried - drafted <= series, sorted(queried - drafted - series)


def test_plugins_add_collectors(debug: DebugServer) -> None:
    assert value(scrape(debug), "kronk_probe_models") == 1


def test_the_debug_routes_are_not_on_the_api_port(debug: DebugServer) -> None:
    for path in ("/metrics", "/debug/threads", "/debug/profile?seconds=0.1"):
        assert httpx.get(f"{debug.api}{path}").status_code == 404, path
    index = httpx.get(f"{debug.debug}/debug/")
    assert index.status_code == 200 and "/debug/profile" in index.text


def test_with_metrics_on_the_api_port_serves_them_to_admins(
    serve: Serve, tmp_path: Path, port_finder: Callable[[], int]
) -> None:
    """llama-server's --metrics (`metrics: true`, debug.api_metrics): /metrics on the API
    port as well, the same exposition; with auth on, an admin route like the operator's."""
    with debug_server(
        serve,
        tmp_path,
        f"127.0.0.1:{port_finder()}",
        metrics=True,
        sections={"auth-jwt": {"enabled": True}},
    ) as server:
        url = f"{server.api}/metrics"
        assert httpx.get(url).status_code == 401
        admin = {"Authorization": f"Bearer {(tmp_path / 'keys' / 'master.jwt').read_text()}"}
        answer = httpx.get(url, headers=admin)
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
        families = {family.name for family in text_string_to_metric_families(answer.text)}
        assert "kronk_probe_models" in families and "kronk_requests" in families
        assert httpx.get(f"{server.api}/debug/threads", headers=admin).status_code == 404


def test_thread_stacks(debug: DebugServer) -> None:
    answer = httpx.get(f"{debug.debug}/debug/threads")
    assert answer.status_code == 200
    assert "thread MainThread" in answer.text
    assert re.search(r"thread kronk-engine-\S+ \(id \d+\):\n", answer.text)
    assert "in _run" in answer.text  # the engine's loop, as a traceback shows it


@contextlib.contextmanager
def generating(server: DebugServer) -> Iterator[list[int]]:
    """A long generation streaming while the block runs; yields its count of chunks so far."""
    counting = [{"role": "user", "content": "Count from 1 to 500, one number a line."}]
    payload = {**body(counting), "max_tokens": 300, "stream": True}
    started, stop = threading.Event(), threading.Event()
    chunks = [0]

    def run() -> None:
        with httpx.stream("POST", f"{server.api}/v1/chat/completions", json=payload) as response:
            for _ in response.iter_lines():
                chunks[0] += 1
                started.set()
                if stop.is_set():
                    break  # leaving cancels the generation

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(60)
    try:
        yield chunks
    finally:
        stop.set()
        thread.join()


def test_cpu_profile_samples_a_busy_engine(debug: DebugServer) -> None:
    """Every thread is sampled in every round: the engine, held inside its decode step for
    the whole profile, is found there each time the main thread is sampled."""
    loaded = debug.kronk.get_loaded()
    assert loaded is not None
    with generating(debug), gated(loaded.engine) as gate:
        assert gate.held.wait(60)
        answer = httpx.get(
            f"{debug.debug}/debug/profile", params={"seconds": 0.5, "interval_ms": 5}, timeout=30
        )
    assert answer.status_code == 200
    stacks = {}
    for line in answer.text.splitlines():
        stack, _, count = line.rpartition(" ")
        stacks[stack] = int(count)
    assert all(" " not in stack for stack in stacks)  # folded format: one space, before the count
    # This server's engine is the one held in the gate (other tests' servers in this process
    # have engines of the same name, idle).
    held = [stack for stack in stacks if "EngineGate.__call__" in stack]
    assert held and all(
        stack.startswith("kronk-engine-") and "Engine._step" in stack for stack in held
    ), held
    main = sum(count for stack, count in stacks.items() if stack.startswith("MainThread;"))
    assert sum(stacks[stack] for stack in held) == main >= 1


def test_memory_top_while_serving(debug: DebugServer) -> None:
    kept: list[bytearray] = []
    answered = threading.Event()

    def allocate() -> None:  # allocations inside the window, whatever its timing
        while not answered.is_set():
            kept.append(bytearray(1024))
            time.sleep(0.001)

    allocator = threading.Thread(target=allocate)
    with generating(debug):
        allocator.start()
        try:
            answer = httpx.get(
                f"{debug.debug}/debug/memory", params={"seconds": 0.5, "limit": 5}, timeout=30
            )
        finally:
            answered.set()
            allocator.join()
    assert answer.status_code == 200
    head = re.match(r"(\d+) allocation sites hold [\d.]+ KiB .* the top (\d+):", answer.text)
    assert head is not None, answer.text
    assert int(head.group(1)) > 0 and int(head.group(2)) == min(5, int(head.group(1)))
    assert answer.text.count(" KiB in ") == int(head.group(2))


def test_event_loop_lag(debug: DebugServer) -> None:
    answer = httpx.get(f"{debug.debug}/debug/loop-lag", params={"seconds": 1, "interval_ms": 10})
    assert answer.status_code == 200
    lag = answer.json()
    # The first probe had the whole second to come back from a loop that is free.
    assert lag["samples"] >= 1
    assert 0 <= lag["mean_seconds"] <= lag["max_seconds"]


def test_a_blocked_event_loop_shows_in_the_probe_the_stacks_and_the_histogram(
    debug: DebugServer,
) -> None:
    """The debug server answers on its own loop while the API's is stuck, and says where."""
    blocker = debug.blocker
    blocker.entered.clear()
    blocker.release.clear()
    lag_count = "kronk_event_loop_lag_seconds_count"
    before = scrape(debug)
    thread = threading.Thread(
        target=lambda: httpx.get(f"{debug.api}/probe/block-loop", timeout=60)
    )
    thread.start()
    try:
        assert blocker.entered.wait(30)
        lag = httpx.get(
            f"{debug.debug}/debug/loop-lag", params={"seconds": 1, "interval_ms": 50}, timeout=30
        ).json()
        stacks = httpx.get(f"{debug.debug}/debug/threads", timeout=30).text
    finally:
        blocker.release.set()
        thread.join()
    assert lag["samples"] == 0 and lag["pending"] >= 1  # none came back: the loop is stuck
    assert "in block_the_loop\n    blocker.release.wait(60)" in stacks
    # The loop was stuck over a second, so the lag monitor's 0.5 s timer came back more
    # than 0.5 s late once it could run (it runs on that loop, hence the wait).
    deadline = time.monotonic() + 30
    while True:
        after = scrape(debug)
        slow = delta(before, after, lag_count) - delta(
            before, after, "kronk_event_loop_lag_seconds_bucket", le="0.5"
        )
        if slow >= 1:
            break
        assert time.monotonic() < deadline, "no lag observed"
        time.sleep(0.1)

    def released() -> bool:  # every probe comes back (a loaded machine may need more tries)
        lag = httpx.get(f"{debug.debug}/debug/loop-lag", params={"seconds": 0.1}).json()
        return bool(lag["pending"] == 0)

    assert reached(released, 30)


@pytest.mark.parametrize(
    "query",
    ["/debug/profile?seconds=0", "/debug/profile?seconds=abc", "/debug/memory?seconds=1000",
     "/debug/loop-lag?interval_ms=0"],
)
def test_bad_parameters_are_400(debug: DebugServer, query: str) -> None:
    answer = httpx.get(f"{debug.debug}{query}")
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"]


def test_off_loopback_with_auth_the_debug_server_wants_an_admin_token(
    serve: Serve, tmp_path: Path, port_finder: Callable[[], int]
) -> None:
    port = port_finder()
    with debug_server(
        serve, tmp_path, f"0.0.0.0:{port}", sections={"auth-jwt": {"enabled": True}}
    ) as server:
        admin = (tmp_path / "keys" / "master.jwt").read_text()
        minted = httpx.post(
            f"{server.api}/v1/kronk/security/tokens",
            json={"duration": "1h", "endpoints": "chat-completions"},
            headers={"Authorization": f"Bearer {admin}"},
        )
        user = minted.json()["token"]
        for path in ("/metrics", "/debug/threads"):
            url = f"{server.debug}{path}"
            assert httpx.get(url).status_code == 401
            assert httpx.get(url, headers={"Authorization": f"Bearer {user}"}).status_code == 403
            assert httpx.get(url, headers={"Authorization": f"Bearer {admin}"}).status_code == 200


def test_off_loopback_without_auth_it_warns(
    serve: Serve,
    tmp_path: Path,
    port_finder: Callable[[], int],
    caplog: pytest.LogCaptureFixture,
) -> None:
    host = f"0.0.0.0:{port_finder()}"
    with caplog.at_level(logging.WARNING), debug_server(serve, tmp_path, host) as server:
        assert httpx.get(f"{server.debug}/metrics").status_code == 200
    assert f"the debug server listens on {host}, off loopback" in caplog.text


def test_on_loopback_with_auth_no_token_is_needed(
    serve: Serve, tmp_path: Path, port_finder: Callable[[], int]
) -> None:
    with debug_server(
        serve, tmp_path, f"127.0.0.1:{port_finder()}", sections={"auth-jwt": {"enabled": True}}
    ) as server:
        assert httpx.get(f"{server.api}/v1/models").status_code == 401
        assert httpx.get(f"{server.debug}/metrics").status_code == 200


def test_a_taken_port_leaves_the_api_up(
    serve: Serve, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        host = f"127.0.0.1:{taken.getsockname()[1]}"
        with caplog.at_level(logging.ERROR), debug_server(serve, tmp_path, host) as server:
            assert httpx.get(f"{server.api}/v1/liveness").status_code == 200
    assert f"debug server not started: cannot listen on {host}" in caplog.text


def test_disabled_means_no_debug_server(
    serve: Serve, tmp_path: Path, port_finder: Callable[[], int]
) -> None:
    port = port_finder()
    settings = ServerSettings.model_validate(
        {"base_path": tmp_path, "debug": {"enabled": False, "host": f"127.0.0.1:{port}"}}
    )
    app = create_app(settings, kronk=Kronk(kronk_config(tmp_path)))
    with serve(app, lifespan="on") as api:
        assert httpx.get(f"{api}/v1/liveness").status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/metrics")
