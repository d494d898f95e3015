"""Hook implementations of the llamacpp plugin."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click
from litestar.config.app import AppConfig

from kronk_core import hookimpl
from kronk_core.contract import Backend, Register, Section
from kronk_llamacpp.backend import LlamaCppBackend
from kronk_llamacpp.cli import add_commands
from kronk_llamacpp.routes import libs
from kronk_llamacpp.settings import SETTINGS


@hookimpl
def kronk_settings() -> Sequence[Section[Any]]:
    return [SETTINGS]


@hookimpl
def kronk_register_backends(register: Register[Backend]) -> None:
    register("llamacpp", LlamaCppBackend(), default=True)


@hookimpl
def kronk_app(app_config: AppConfig) -> None:
    app_config.route_handlers.append(libs)


@hookimpl
def kronk_cli(group: click.Group) -> None:
    add_commands(group)
