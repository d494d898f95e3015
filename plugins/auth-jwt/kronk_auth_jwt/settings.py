"""The auth-jwt plugin's section of the server settings (`auth-jwt`, flags `--auth-jwt-*`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from kronk_core.contract import ServerSection


class AuthSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=False, description="Require a bearer token on every endpoint but health checks"
    )
    issuer: str = Field(default="kronk", description="The JWT issuer (iss) issued and accepted")
    limit_store: str = Field(
        default="sqlite",
        description="Rate-limit counters: sqlite, sqlite:///PATH or redis://HOST:PORT/DB",
    )
    host: str | None = Field(
        default=None,
        description="HOST:PORT (or URL) of the Kronk server that checks this server's tokens "
        "with its keys, issuer and limits; unset: this server checks them",
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="One static key for a single-user server (llama-server's and vLLM's "
        "--api-key): a request sending it as a bearer token or x-api-key may do anything; "
        "JWTs still work when enabled is on too",
    )


SETTINGS = ServerSection(
    "auth-jwt",
    AuthSettings,
    # The manual's `--auth-enabled`, `KRONK_AUTH_ENABLED`, `auth_enabled:`, and its
    # settings table's KRONK_AUTH_LOCAL_ENABLED and KRONK_AUTH_LOCAL_ISSUER.
    # llama-server's and vLLM's `--api-key` (`KRONK_API_KEY`, `api_key:`).
    spellings={
        "auth_enabled": "enabled",
        "auth_local_enabled": "enabled",
        "auth_issuer": "issuer",
        "auth_local_issuer": "issuer",
        "auth_host": "host",
        "api_key": "api_key",
    },
    deprecated={"auth_limit_store": "limit_store"},
)
