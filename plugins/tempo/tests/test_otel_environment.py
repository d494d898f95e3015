"""OpenTelemetry's standard variables configure tracing where Kronk's settings are silent:
OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT and _PROTOCOL, OTEL_SERVICE_NAME (or service.name in
OTEL_RESOURCE_ATTRIBUTES), OTEL_TRACES_SAMPLER[_ARG], OTEL_SDK_DISABLED. A Kronk setting
(file, flag or KRONK_TEMPO_* variable) wins over each."""

from __future__ import annotations

import pytest

from kronk_core.contract.errors import ConfigError
from kronk_tempo.settings import TempoSettings, with_otel_environment


def resolved(environ: dict[str, str], **given: object) -> TempoSettings:
    return with_otel_environment(TempoSettings.model_validate(given), environ)


def test_without_variables_the_settings_stand() -> None:
    assert resolved({}) == TempoSettings()
    assert resolved({}, host="tempo:4317").host == "tempo:4317"


def test_the_generic_endpoint_is_a_base_url_over_http_by_default() -> None:
    found = resolved({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"})
    assert (found.host, found.protocol) == ("http://collector:4318/v1/traces", "http")
    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    }
    grpc = resolved(environ)
    assert (grpc.host, grpc.protocol) == ("http://collector:4317", "grpc")


def test_the_traces_endpoint_and_protocol_come_before_the_generic_ones() -> None:
    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4318",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://traces.example:443/custom/path",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
    }
    found = resolved(environ)
    assert (found.host, found.protocol) == ("https://traces.example:443/custom/path", "http")


def test_service_name_and_sampler() -> None:
    environ = {
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod, service.name=from-resource",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.05",
    }
    assert (resolved(environ).service_name, resolved(environ).probability) == (
        "from-resource",
        0.05,
    )
    named = resolved({**environ, "OTEL_SERVICE_NAME": "kronk-eu"})
    assert named.service_name == "kronk-eu"
    assert resolved({"OTEL_TRACES_SAMPLER": "always_on"}).probability == 1.0
    assert resolved({"OTEL_TRACES_SAMPLER": "parentbased_always_off"}).probability == 0.0


def test_kronk_s_settings_win_over_each_variable() -> None:
    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "from-otel",
        "OTEL_TRACES_SAMPLER": "always_on",
    }
    found = resolved(
        environ, host="tempo:4317", protocol="grpc", service_name="kronk-1", probability=0.5
    )
    assert found == TempoSettings(
        host="tempo:4317", protocol="grpc", service_name="kronk-1", probability=0.5
    )


def test_sdk_disabled_keeps_tracing_off_unless_kronk_asks() -> None:
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"}
    assert resolved(environ).host is None
    assert resolved(environ, host="tempo:4317").host == "tempo:4317"


@pytest.mark.parametrize(
    ("environ", "key"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ({"OTEL_TRACES_SAMPLER": "jaeger_remote"}, "OTEL_TRACES_SAMPLER"),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"},
            "OTEL_TRACES_SAMPLER_ARG",
        ),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
            "OTEL_TRACES_SAMPLER_ARG",
        ),
    ],
)
def test_what_kronk_cannot_do_is_refused_by_name(environ: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolved(environ)
    assert info.value.key == key
