"""The catalog plugin's section of the server settings (`catalog`, flags `--catalog-*`)."""

from __future__ import annotations

import os
import re

import huggingface_hub
from pydantic import BaseModel, ConfigDict, Field

from kronk_core.contract import ServerSection

# Kronk's own catalog repository, as GitHub contents-API folder listings.
DEFAULT_SOURCE = "https://api.github.com/repos/ardanlabs/kronk_catalogs/contents/catalogs"
DEFAULT_TEMPLATES_SOURCE = (
    "https://api.github.com/repos/ardanlabs/kronk_catalogs/contents/templates"
)
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
# The manual's name for the Hugging Face token; the rule's name (KRONK_CATALOG_HF_TOKEN) wins.
HF_TOKEN_VARIABLE = "KRONK_HF_TOKEN"


# The manual's variables naming a GitHub repository (`https://github.com/ORG/REPO`) whose
# catalogs/ and templates/ folders are the sources, where the sources are not set.
REPOSITORY_VARIABLES = {
    "catalogs": "KRONK_CATALOG_GITHUB_REPO",
    "templates": "KRONK_TEMPLATES_GITHUB_REPO",
}


def github_folder(url: str, folder: str) -> str:
    """The manual's repository URL (`https://github.com/ORG/REPO`) → that repository's
    `folder` as the GitHub contents-API listing a catalog source is; another URL as given."""
    match = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?/?", url)
    if match is None:
        return url
    return f"https://api.github.com/repos/{match[1]}/{match[2]}/contents/{folder}"


def default_source(folder: str) -> str:
    """Where `folder` (catalogs, templates) comes from unless its source is set: the folder
    of the manual's repository variable, else Kronk's own repository's."""
    repository = os.environ.get(REPOSITORY_VARIABLES[folder])
    if repository:
        return github_folder(repository, folder)
    return DEFAULT_SOURCE if folder == "catalogs" else DEFAULT_TEMPLATES_SOURCE


class CatalogSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field(
        default_factory=lambda: default_source("catalogs"),
        description="Where `catalog update` fetches catalogs: a GitHub folder listing or one YAML",
    )
    templates_source: str = Field(
        default_factory=lambda: default_source("templates"),
        description="Where `catalog update` fetches the chat templates catalogs name (empty: none)",
    )
    check_integrity: bool = Field(
        default=False,
        description="Read every pulled catalog model's files at the server's start and "
        "compare them with their catalog's sha256; one that differs stops the start (the "
        "manual's --ignore-integrity-check=false)",
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
