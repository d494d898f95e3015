"""The tempo plugin's settings and exporter choice (no server needed)."""

from __future__ import annotations

import sys

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http
from pydantic import ValidationError

from kronk_core.contract.errors import ConfigError
from kronk_tempo.settings import TempoSettings
from kronk_tempo.tracing import exporter_for


@pytest.mark.parametrize(
    ("host", "endpoint"),
    [
        ("localhost:4318", "http://localhost:4318/v1/traces"),
        ("http://collector:4318", "http://collector:4318/v1/traces"),
        ("https://collector/otlp/v1/traces", "https://collector/otlp/v1/traces"),
    ],
)
def test_http_endpoints(host: str, endpoint: str) -> None:
    exporter = exporter_for(TempoSettings(host=host, protocol="http"))
    assert isinstance(exporter, Http) and exporter._endpoint == endpoint
    exporter.shutdown()


@pytest.mark.parametrize(
    ("host", "insecure"),
    [("localhost:4317", True), ("http://tempo:4317", True), ("https://tempo:4317", False)],
)
def test_grpc_endpoints_are_plain_text_unless_https(host: str, insecure: bool) -> None:
    exporter = exporter_for(TempoSettings(host=host))
    assert isinstance(exporter, Grpc)
    assert (exporter._credentials is None) is insecure
    exporter.shutdown()


def test_grpc_without_its_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # As if kronk-tempo were installed without its `grpc` extra.
    for module in ("opentelemetry.exporter.otlp.proto.grpc", Grpc.__module__):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(
        ConfigError,
        match=r"^tempo\.protocol: grpc needs the OTLP gRPC exporter: "
        r"pip install 'kronk-tempo\[grpc\]', or export over http",
    ):
        exporter_for(TempoSettings(host="localhost:4317"))
    exporter_for(TempoSettings(host="localhost:4318", protocol="http")).shutdown()


@pytest.mark.parametrize("probability", [-0.1, 1.5])
def test_probability_is_a_share(probability: float) -> None:
    with pytest.raises(ValidationError, match="probability"):
        TempoSettings(probability=probability)


def test_defaults_are_the_manuals() -> None:
    settings = TempoSettings()
    assert settings.host is None  # no tracing until a collector is named
    assert (settings.service_name, settings.probability, settings.protocol) == (
        "kronk",
        0.25,
        "grpc",
    )
