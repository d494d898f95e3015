"""The catalog plugin's section of the server settings (`catalog`, flags `--catalog-*`)."""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field

from kronk_core.sections import ServerSection

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
    hf_endpoint: str = Field(
        default=DEFAULT_HF_ENDPOINT,
        description="The Hugging Face Hub that HF-REPO/FILE names (and the token) belong to",
    )
    hf_token: str | None = Field(
        default=None,
        description="Hugging Face token for gated models, sent to hf_endpoint's host only",
    )

    def token(self) -> str | None:
        """The Hugging Face token: this setting, else the manual's KRONK_HF_TOKEN."""
        return self.hf_token or os.environ.get(HF_TOKEN_VARIABLE) or None


SETTINGS = ServerSection("catalog", CatalogSettings)
