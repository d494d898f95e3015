"""The Kronk model server: a Litestar app composed from plugins, and the CLI."""

from kronk_api.app import create_app
from kronk_api.settings import ServerSettings

__all__ = ["ServerSettings", "create_app"]
