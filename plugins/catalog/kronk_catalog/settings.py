"""The catalog plugin's section of the server settings (`catalog`, flags `--catalog-*`)."""

from __future__ import annotations

import os

import huggingface_hub
from pydantic import BaseModel, ConfigDict, Field

from kronk_core.settings.sections import ServerSection

# Kronk's own catalog repository, as GitHub contents-API folder listings.
DEFAULT_SOURCE = "https://api.github.com/repos/ardanlabs/kronk_catalogs/contents/catalogs"
DEFAULT_TEMPLATES_SOURCE = (
    "https://api.github.com/repos/ardanlabs/kronk_catalogs/contents/templates"
)
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
# The manual's name for the Hugging Face token; the rule's name (KRONK_CATALOG_HF_TOKEN) wins.
HF_TOKEN_VARIABLE = "KRONK_HF_TOKEN"


class CatalogSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field(
        default=DEFAULT_SOURCE,
        description="Where `catalog update` fetches catalogs: a GitHub folder listing or one YAML",
    )
    templates_source: str = Field(
        default=DEFAULT_TEMPLATES_SOURCE,
        description="Where `catalog update` fetches the chat templates catalogs name (empty: none)",
    )
    hf_endpoint: str | None = Field(
        default=None,
        description="The Hugging Face Hub that model references name (and the token belongs to);"
        f" unset: HF_ENDPOINT, else {DEFAULT_HF_ENDPOINT}",
    )
    hf_token: str | None = Field(
        default=None,
        description="Hugging Face token for gated models, sent to the Hub's host only; unset: "
        "KRONK_HF_TOKEN, HF_TOKEN, else the one `hf auth login` saved",
    )

    def endpoint(self) -> str:
        return hub_endpoint(self.hf_endpoint)

    def token(self) -> str | None:
        return hub_token(self.hf_token)


def hub_endpoint(configured: str | None = None) -> str:
    """The Hub's base URL: the setting, else HF_ENDPOINT (a mirror), else huggingface.co."""
    return (configured or os.environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT).rstrip("/")


def hub_token(configured: str | None = None) -> str | None:
    """The Hub's token: the setting, else the manual's KRONK_HF_TOKEN, else huggingface_hub's
    (HF_TOKEN, or the token `hf auth login` saved)."""
    return configured or os.environ.get(HF_TOKEN_VARIABLE) or huggingface_hub.get_token()


SETTINGS = ServerSection("catalog", CatalogSettings)
