"""The tempo plugin's section of the server settings (`tempo`, flags `--tempo-*`).

Named as in the Kronk manual: `--tempo-host`, `--tempo-service-name`,
`--tempo-probability`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kronk_core.contract import ConfigError, ServerSection


class TempoSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str | None = Field(
        default=None,
        description="OTLP collector to send traces to: HOST:PORT or a URL (unset: no tracing)",
    )
    protocol: Literal["grpc", "http"] = Field(
        default="grpc",
        description="OTLP transport: grpc (port 4317) or http, protobuf over HTTP (4318)",
    )
    service_name: str = Field(default="kronk", description="service.name of the traces")
    probability: Annotated[float, Field(ge=0.0, le=1.0)] = Field(
        default=0.25,
        description="Share of requests traced, 0.0-1.0 (a client's sampled traceparent wins)",
    )


SETTINGS = ServerSection("tempo", TempoSettings)


# OTEL_TRACES_SAMPLER values and the share of requests each traces (ratio: its _ARG).
_SAMPLERS = {
    "always_on": 1.0,
    "parentbased_always_on": 1.0,
    "always_off": 0.0,
    "parentbased_always_off": 0.0,
    "traceidratio": None,
    "parentbased_traceidratio": None,
}
_PROTOCOLS = {"grpc": "grpc", "http/protobuf": "http"}


def with_otel_environment(settings: TempoSettings, environ: Mapping[str, str]) -> TempoSettings:
    """The settings with OpenTelemetry's standard variables (OTEL_EXPORTER_OTLP_*,
    OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER[_ARG], OTEL_SDK_DISABLED) filling what Kronk's own
    settings leave unset: a Kronk setting, flag or KRONK_TEMPO_* variable wins."""
    given = settings.model_fields_set
    found: dict[str, Any] = {}
    traces_endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    endpoint = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    protocol_name, protocol = _otel("PROTOCOL", environ)
    disabled = environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    if "protocol" not in given and protocol:
        if protocol not in _PROTOCOLS:
            raise ConfigError(protocol_name, f"{protocol!r}: Kronk exports grpc or http/protobuf")
        found["protocol"] = _PROTOCOLS[protocol]
    if "host" not in given and (traces_endpoint or endpoint) and not disabled:
        # The specification's default transport is HTTP; its generic endpoint is a base URL.
        http = found.setdefault("protocol", "http") == "http"
        found["host"] = traces_endpoint or (
            f"{endpoint.rstrip('/')}/v1/traces" if http else endpoint
        )
    service = environ.get("OTEL_SERVICE_NAME", "").strip() or _resource_service(environ)
    if "service_name" not in given and service:
        found["service_name"] = service
    if "probability" not in given:
        probability = _sampled_share(environ)
        if probability is not None:
            found["probability"] = probability
    return settings.model_copy(update=found) if found else settings


def _otel(name: str, environ: Mapping[str, str]) -> tuple[str, str]:
    """The traces-specific variable if set, else the generic one: (its name, its value)."""
    for variable in (f"OTEL_EXPORTER_OTLP_TRACES_{name}", f"OTEL_EXPORTER_OTLP_{name}"):
        value = environ.get(variable, "").strip().lower()
        if value:
            return variable, value
    return "", ""


def _resource_service(environ: Mapping[str, str]) -> str:
    for pair in environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, _, value = pair.partition("=")
        if key.strip() == "service.name":
            return value.strip()
    return ""


def _sampled_share(environ: Mapping[str, str]) -> float | None:
    sampler = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if not sampler:
        return None
    if sampler not in _SAMPLERS:
        raise ConfigError(
            "OTEL_TRACES_SAMPLER", f"{sampler!r}: Kronk samples with {', '.join(_SAMPLERS)}"
        )
    share = _SAMPLERS[sampler]
    if share is not None:
        return share
    argument = environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0").strip()
    try:
        ratio = float(argument)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise ConfigError("OTEL_TRACES_SAMPLER_ARG", f"{argument!r}: a ratio from 0.0 to 1.0")
    return ratio
