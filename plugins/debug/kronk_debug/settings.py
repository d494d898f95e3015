"""The debug plugin's section of the server settings (`debug`, flags `--debug-*`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kronk_api.contract import check_host_port
from kronk_core.contract import ServerSection


class DebugSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=True, description="Run the debug server (/metrics and the /debug/ profiling routes)"
    )
    host: str = Field(
        default="127.0.0.1:8090",
        description="HOST:PORT of the debug server; off loopback it needs admin tokens when "
        "auth is on",
    )

    api_metrics: bool = Field(
        default=False,
        description="Serve /metrics on the API port too (llama-server's --metrics), for a "
        "scraper that reaches only that port; an admin route when auth is on",
    )

    @field_validator("host")
    @classmethod
    def _host_port(cls, value: str) -> str:
        return check_host_port(value)


# llama-server's `--metrics` (`KRONK_METRICS`, `metrics:`); the manual's
# `KRONK_WEB_DEBUG_HOST` (`--web-debug-host`).
SETTINGS = ServerSection(
    "debug", DebugSettings, spellings={"metrics": "api_metrics", "web_debug_host": "host"}
)
