"""Tracing (the tempo plugin) on a real server, exported to real OTLP receivers in this process.

The receivers decode what the exporter sends (OTLP protobuf, over HTTP and over
gRPC) and the tests read the span tree out of it: names, parents, attributes,
the client's W3C traceparent continued, sampling, health checks left out.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_llamacpp.packaged import GEMMA_MODEL_ID, GEMMA_MODEL_SETTINGS
from kronk_tempo.middleware import STATE_KEY
from kronk_tempo.tracing import Tracing
from kronk_testing.plugin import SCRIPTED_MODEL_ID, ScriptedKronk

if TYPE_CHECKING:
    from kronk_testing.server import Serve

# A word the spans must never carry (prompts stay out of traces).
SECRET = "zanzibar"
CHAT = {
    "model": GEMMA_MODEL_ID,
    "messages": [{"role": "user", "content": f"Say the word {SECRET}."}],
    "max_tokens": 4,
    "temperature": 0,
}
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@dataclass
class Received:
    """Every export request a receiver decoded, and their raw bytes."""

    requests: list[trace_service_pb2.ExportTraceServiceRequest] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, body: bytes) -> None:
        with self.lock:
            self.raw.append(body)
            self.requests.append(trace_service_pb2.ExportTraceServiceRequest.FromString(body))

    def spans(self) -> list[Span]:
        with self.lock:
            return [
                span
                for request in self.requests
                for resource in request.resource_spans
                for scope in resource.scope_spans
                for span in scope.spans
            ]

    def service_names(self) -> set[str]:
        with self.lock:
            return {
                attribute.value.string_value
                for request in self.requests
                for resource in request.resource_spans
                for attribute in resource.resource.attributes
                if attribute.key == "service.name"
            }

    def clear(self) -> None:
        with self.lock:
            self.requests.clear()
            self.raw.clear()


@contextlib.contextmanager
def http_receiver() -> Iterator[tuple[str, Received]]:
    """An OTLP/HTTP receiver: POST /v1/traces with an ExportTraceServiceRequest."""
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            kind = self.headers["Content-Type"]
            if self.path != "/v1/traces" or kind != "application/x-protobuf":
                self.send_response(404)
                self.end_headers()
                return
            received.add(body)
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def grpc_receiver() -> Iterator[tuple[str, Received]]:
    """An OTLP/gRPC receiver: the collector's TraceService."""
    received = Received()

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(
            self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
        ) -> trace_service_pb2.ExportTraceServiceResponse:
            received.add(request.SerializeToString())
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", received
    finally:
        server.stop(grace=None)


@pytest.fixture(scope="module")
def tracing_config(tmp_path_factory: pytest.TempPathFactory, tiny_llama_path: Path) -> KronkConfig:
    """The default model (IMC, 2 slots), and a tiny model; each server has its own Kronk
    (its shutdown closes it), which loads them on first use."""
    return KronkConfig(
        base_path=tmp_path_factory.mktemp("tracing"),
        default_model=GEMMA_MODEL_ID,
        models={
            GEMMA_MODEL_ID: ModelConfig.model_validate(
                {**GEMMA_MODEL_SETTINGS, "context_window": 2048, "n_seq_max": 2}
            ),
            "tiny": ModelConfig(
                model_path=tiny_llama_path, templates={"template": "chatml"}, context_window=256
            ),
        },
    )


@contextlib.contextmanager
def traced_server(
    serve: Serve,
    config: KronkConfig,
    host: str,
    *,
    protocol: str = "http",
    probability: float | None = 1.0,
    service_name: str = "kronk",
    **server: Any,
) -> Iterator[tuple[str, Tracing]]:
    """A server tracing to `host`; `probability=None` leaves the setting at its default."""
    tempo: dict[str, Any] = {"host": host, "protocol": protocol, "service_name": service_name}
    if probability is not None:
        tempo["probability"] = probability
    settings = ServerSettings.model_validate(
        {
            "tempo": tempo,
            "debug": {"enabled": False},
            "model": GEMMA_MODEL_ID,
            "preload": True,
            **server,
        }
    )
    app = create_app(settings, kronk=Kronk(config))
    with serve(app, lifespan="on") as base_url:
        yield base_url, app.state[STATE_KEY]


def by_name(spans: list[Span]) -> dict[str, Span]:
    named = {span.name: span for span in spans}
    assert len(named) == len(spans), [span.name for span in spans]
    return named


def attributes(span: Span) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for attribute in span.attributes:
        value = attribute.value
        values[attribute.key] = getattr(value, value.WhichOneof("value"))
    return values


def within(child: Span, parent: Span) -> bool:
    return (
        parent.start_time_unix_nano <= child.start_time_unix_nano
        and child.end_time_unix_nano <= parent.end_time_unix_nano
    )


@pytest.fixture(scope="module")
def http_traced(
    serve: Serve, tracing_config: KronkConfig
) -> Iterator[tuple[str, Tracing, Received]]:
    with http_receiver() as (host, received), traced_server(serve, tracing_config, host) as server:
        yield *server, received


@pytest.fixture
def traced(http_traced: tuple[str, Tracing, Received]) -> tuple[str, Tracing, Received]:
    """The module's traced server, with what earlier tests exported flushed and cleared."""
    _, tracing, received = http_traced
    tracing.flush()
    received.clear()
    return http_traced


def test_a_chat_request_is_one_trace_continuing_the_clients(
    traced: tuple[str, Tracing, Received],
) -> None:
    base_url, tracing, received = traced
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "X-Request-ID": "trace-me-1"}
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    body = {**CHAT, "tools": tools}
    answer = httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    tracing.flush()

    spans = by_name(received.spans())
    assert set(spans) == {
        "POST /v1/chat/completions",
        "prepare-request",
        "create-prompt",
        "queue-wait",
        "process-request",
        "process-cache",
        "prefill",
        "first-token",
        "token-generation",
        "tool-call-parsing",
    }
    assert received.service_names() == {"kronk"}
    assert {span.trace_id.hex() for span in spans.values()} == {TRACE_ID}
    root = spans["POST /v1/chat/completions"]
    assert root.parent_span_id.hex() == PARENT_ID and root.kind == Span.SPAN_KIND_SERVER
    root_attributes = attributes(root)
    assert root_attributes["kronk.request_id"] == "trace-me-1"
    assert root_attributes["http.route"] == "/v1/chat/completions"
    assert root_attributes["http.response.status_code"] == 200
    assert root_attributes["gen_ai.request.model"] == GEMMA_MODEL_ID
    assert root_attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]

    parents = {
        "prepare-request": root,
        "queue-wait": root,
        "process-request": root,
        "tool-call-parsing": root,
        "create-prompt": spans["prepare-request"],
        "process-cache": spans["process-request"],
        "prefill": spans["process-request"],
        "first-token": spans["process-request"],
        "token-generation": spans["process-request"],
    }
    for name, parent in parents.items():
        assert spans[name].parent_span_id == parent.span_id, name
        assert within(spans[name], parent), name

    process = attributes(spans["process-request"])
    assert process["kronk.request_id"] == "trace-me-1"
    assert process["kronk.finish_reason"] in ("length", "stop") and process["queue-wait"] >= 0
    cached = attributes(spans["process-cache"])["kronk.cached_tokens"]
    cached_reported = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    assert cached == cached_reported
    prefill = attributes(spans["prefill"])["kronk.prefill_tokens"]
    assert prefill == usage["prompt_tokens"] - cached
    generation = attributes(spans["token-generation"])
    assert generation["kronk.completion_tokens"] == usage["completion_tokens"] > 1
    assert generation["kronk.tokens_per_second"] > 0
    parsing = attributes(spans["tool-call-parsing"])
    assert parsing["kronk.tools"] == 1 and parsing["kronk.parse_seconds"] >= 0
    # The phases follow each other.
    order = ["process-cache", "prefill", "first-token", "token-generation"]
    for before, after in itertools.pairwise(order):
        assert spans[before].end_time_unix_nano <= spans[after].start_time_unix_nano
    # No prompt text anywhere in what was exported.
    assert all(SECRET.encode() not in raw for raw in received.raw)


def test_a_second_turn_reports_the_cached_tokens(
    http_traced: tuple[str, Tracing, Received],
) -> None:
    base_url, tracing, received = http_traced
    system = {"role": "system", "content": "You answer in one short sentence. " * 40}
    opening = [system, {"role": "user", "content": "Name a colour."}]
    first = httpx.post(
        f"{base_url}/v1/chat/completions", json={**CHAT, "messages": opening}, timeout=60
    ).json()
    reply = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
    turn = {**CHAT, "messages": [*opening, reply, {"role": "user", "content": "Another."}]}
    tracing.flush()  # what earlier requests left in the batch goes out first
    received.clear()
    second = httpx.post(f"{base_url}/v1/chat/completions", json=turn, timeout=60).json()
    tracing.flush()
    spans = by_name(received.spans())
    cached = attributes(spans["process-cache"])["kronk.cached_tokens"]
    assert cached == second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    prefill = attributes(spans["prefill"])["kronk.prefill_tokens"]
    assert prefill == second["usage"]["prompt_tokens"] - cached


def test_streams_and_other_dialects_are_traced_too(
    traced: tuple[str, Tracing, Received],
) -> None:
    base_url, tracing, received = traced
    with httpx.stream(
        "POST", f"{base_url}/v1/messages", json={**CHAT, "stream": True}, timeout=60
    ) as streamed:
        assert streamed.status_code == 200
        assert "message_stop" in streamed.read().decode()
    tracing.flush()
    spans = by_name(received.spans())
    assert "POST /v1/messages" in spans and "token-generation" in spans
    assert spans["process-request"].parent_span_id == spans["POST /v1/messages"].span_id


def test_health_checks_are_not_traced(traced: tuple[str, Tracing, Received]) -> None:
    base_url, tracing, received = traced
    assert httpx.get(f"{base_url}/v1/liveness").status_code == 200
    assert httpx.get(f"{base_url}/v1/readiness").status_code == 200
    assert httpx.get(f"{base_url}/health").status_code == 200
    assert httpx.get(f"{base_url}/v1/models").status_code == 200
    tracing.flush()
    assert [span.name for span in received.spans()] == ["GET /v1/models"]


def test_a_model_load_is_a_span_of_the_request_that_caused_it(
    traced: tuple[str, Tracing, Received],
) -> None:
    base_url, tracing, received = traced
    answer = httpx.post(
        f"{base_url}/v1/chat/completions", json={**CHAT, "model": "tiny"}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    tracing.flush()
    spans = by_name(received.spans())
    load = spans["model-file-load-time"]
    assert load.parent_span_id == spans["POST /v1/chat/completions"].span_id
    assert attributes(load)["kronk.model"] == "tiny" and attributes(load)["kronk.load_seconds"] > 0
    assert within(load, spans["prepare-request"])


def test_errors_mark_the_span(traced: tuple[str, Tracing, Received]) -> None:
    base_url, tracing, received = traced
    answer = httpx.post(f"{base_url}/v1/chat/completions", json={**CHAT, "max_tokens": 0})
    assert answer.status_code == 400
    tracing.flush()
    (span,) = received.spans()
    assert attributes(span)["http.response.status_code"] == 400


@pytest.mark.parametrize(
    ("traceparent", "traced"),
    [
        (None, False),
        (f"00-{TRACE_ID}-{PARENT_ID}-01", True),
        (f"00-{TRACE_ID}-{PARENT_ID}-00", False),
    ],
    ids=["no-parent", "sampled-parent", "unsampled-parent"],
)
def test_sampling_probability_zero_follows_the_clients_decision(
    serve: Serve, tracing_config: KronkConfig, traceparent: str | None, traced: bool
) -> None:
    with (
        http_receiver() as (host, received),
        traced_server(serve, tracing_config, host, probability=0.0) as (base_url, tracing),
    ):
        headers = {"traceparent": traceparent} if traceparent else {}
        for _ in range(3):
            assert httpx.get(f"{base_url}/v1/models", headers=headers).status_code == 200
        tracing.flush()
        assert len(received.spans()) == (3 if traced else 0)


def test_export_over_grpc(serve: Serve, tracing_config: KronkConfig) -> None:
    with (
        grpc_receiver() as (host, received),
        traced_server(
            serve, tracing_config, host, protocol="grpc", service_name="kronk-eu-1"
        ) as (base_url, tracing),
    ):
        answer = httpx.post(f"{base_url}/v1/chat/completions", json=CHAT, timeout=60)
        assert answer.status_code == 200
        tracing.flush()
        names = {span.name for span in received.spans()}
        assert received.service_names() == {"kronk-eu-1"}
    assert {"POST /v1/chat/completions", "process-request", "token-generation"} <= names


def test_the_default_probability_traces_a_quarter_chosen_by_trace_id(
    serve: Serve, tracing_config: KronkConfig
) -> None:
    """Unset, `tempo.probability` is 0.25: a trace is kept when the low 64 bits of its
    random id fall in the lowest quarter (OpenTelemetry's TraceIdRatioBased)."""
    requests = 200
    with (
        http_receiver() as (host, received),
        traced_server(serve, tracing_config, host, probability=None) as (base_url, tracing),
        httpx.Client(base_url=base_url) as client,
    ):
        for _ in range(requests):
            assert client.get("/v1/models").status_code == 200
        tracing.flush()
        spans = received.spans()
    bound = 2**64 // 4
    assert all(int.from_bytes(span.trace_id[8:], "big") < bound for span in spans)
    assert len({span.trace_id for span in spans}) == len(spans)
    # Binomial(200, 0.25): 50 on average; outside 25-75 once in more than 20,000 runs.
    assert 25 <= len(spans) <= 75, len(spans)


def test_no_text_in_spans_even_with_insecure_logging(
    serve: Serve, tracing_config: KronkConfig
) -> None:
    """Insecure logging puts prompts in log lines, never in spans: traces leave the machine."""
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
    prompt = f"Say the word {SECRET}, then count from one to twenty."
    payload = {**CHAT, "messages": [{"role": "user", "content": prompt}], "max_tokens": 24}
    with (
        http_receiver() as (host, received),
        traced_server(serve, tracing_config, host, insecure_logging=True) as (base_url, tracing),
    ):
        answer = httpx.post(
            f"{base_url}/v1/chat/completions", json=payload, headers=headers, timeout=60
        )
        assert answer.status_code == 200, answer.text
        tracing.flush()
        names = {span.name for span in received.spans()}
        raw = b"".join(received.raw)
    assert {"POST /v1/chat/completions", "token-generation"} <= names
    completion = answer.json()["choices"][0]["message"]["content"].strip()
    assert answer.json()["usage"]["completion_tokens"] > 8 and len(completion) > 8
    for text in (SECRET, prompt, completion):
        assert text.encode() not in raw, text


def test_opentelemetry_s_variables_alone_turn_tracing_on(
    scripted_kronk: ScriptedKronk, serve: Serve, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No tempo setting: OTEL_EXPORTER_OTLP_ENDPOINT (a base URL, over HTTP as the
    specification's default), OTEL_SERVICE_NAME and OTEL_TRACES_SAMPLER are enough."""
    kronk = scripted_kronk()
    chat = {"model": SCRIPTED_MODEL_ID, "messages": [{"role": "user", "content": "hi"}]}
    with http_receiver() as (host, received):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://{host}")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "kronk-from-otel")
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
        settings = ServerSettings.model_validate(
            {"base_path": tmp_path, "debug": {"enabled": False}}
        )
        app = create_app(settings, kronk=kronk)
        with serve(app, lifespan="on") as base_url:
            answer = httpx.post(f"{base_url}/v1/chat/completions", json=chat, timeout=60)
            assert answer.status_code == 200, answer.text
            app.state[STATE_KEY].flush()
            assert received.service_names() == {"kronk-from-otel"}
            names = {span.name for span in received.spans()}
    assert {"POST /v1/chat/completions", "process-request"} <= names
