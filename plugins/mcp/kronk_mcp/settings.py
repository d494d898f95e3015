"""The mcp plugin's section of the server settings (`mcp`, flags `--mcp-*`, `KRONK_MCP_*`).

The field names give the Kronk manual's variables by the settings rule:
`mcp.host` → `KRONK_MCP_HOST`, `mcp.braveapikey` → `KRONK_MCP_BRAVEAPIKEY`. The
standalone service (`kronk mcp start`) also reads the manual's `MCP_MCP_*` names.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_serializer, field_validator

from kronk_core.contract import Duration, ServerSection

# The hosts that only this machine reaches.
LOOPBACK = ("127.0.0.1", "localhost", "::1")

DEFAULT_LISTEN = "127.0.0.1:9000"
BRAVE_URL = "https://api.search.brave.com/res/v1"

# The manual's variables of the standalone service, by the setting each one sets.
STANDALONE_ENVIRONMENT = {"MCP_MCP_HOST": "mcp.listen", "MCP_MCP_BRAVEAPIKEY": "mcp.braveapikey"}


def split_host_port(value: str) -> tuple[str, int]:
    """`127.0.0.1:9000` → ("127.0.0.1", 9000); `[::1]:9000` → ("::1", 9000)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


class McpSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field(
        default="",
        description="An external MCP service (URL or HOST:PORT); empty: the server starts its own",
    )
    listen: str = Field(
        default=DEFAULT_LISTEN,
        description="HOST:PORT the MCP service listens on (port 0: any free port)",
    )
    braveapikey: SecretStr | None = Field(
        default=None, description="Brave Search API key for the web_search tool"
    )
    brave_url: str = Field(default=BRAVE_URL, description="Base URL of the Brave Search API")
    brave_timeout: Annotated[Duration, Field(gt=0.0)] = Field(
        default=10.0, description="How long web_search waits for Brave Search, e.g. 10s"
    )
    web_search_max_uses: Annotated[int, Field(ge=1)] = Field(
        default=5,
        description="Searches one request may run when Kronk serves an agent's built-in web "
        "search (a client's max_uses may lower it)",
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="Comma-separated origins browsers may call the MCP service from, besides "
        "loopback ones (a port of * allows any port)",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Comma-separated Host header names (HOST or HOST:PORT) the MCP service "
        "answers to, besides loopback ones and its listen address",
    )

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        split_host_port(value)
        return value

    @field_validator("host")
    @classmethod
    def _external(cls, value: str) -> str:
        value = value.strip()
        if value and "://" not in value:
            split_host_port(value)
        elif value and urlsplit(value).scheme not in ("http", "https"):
            raise ValueError(f"expected http(s)://HOST:PORT or HOST:PORT, got {value!r}")
        return value

    @field_validator("brave_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"expected an http(s) URL, got {value!r}")
        return value.rstrip("/")

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, values: list[str]) -> list[str]:
        for value in values:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.path:
                raise ValueError(f"{value!r} is not an origin like https://app.example.com")
        return values

    @field_serializer("braveapikey", when_used="json")
    def _reveal_key(self, key: SecretStr | None) -> str | None:
        """JSON dumps carry the key (a detached server's environment); repr and str never do."""
        return None if key is None else key.get_secret_value()

    @property
    def api_key(self) -> str | None:
        return self.braveapikey.get_secret_value() if self.braveapikey else None

    @property
    def external_url(self) -> str:
        """`mcp.host` as a URL (empty when the server runs its own service)."""
        return self.host if not self.host or "://" in self.host else f"http://{self.host}"


SETTINGS = ServerSection("mcp", McpSettings)
