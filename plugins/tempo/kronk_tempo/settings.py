"""The tempo plugin's section of the server settings (`tempo`, flags `--tempo-*`).

Named as in the Kronk manual: `--tempo-host`, `--tempo-service-name`,
`--tempo-probability`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from kronk_core.settings.sections import ServerSection


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
