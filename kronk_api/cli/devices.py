"""`kronk devices`."""

from __future__ import annotations

import click

from kronk_api.cli.common import fail
from kronk_api.cli.output import echo_table, mib
from kronk_core import Kronk, KronkConfig
from kronk_core.contract.errors import KronkError


@click.command("devices")
def devices() -> None:
    """List the devices models can run on, with free and total memory."""
    try:
        found = Kronk(KronkConfig()).models.devices()
    except KronkError as exc:
        fail(exc)
    rows = [("INDEX", "NAME", "TYPE", "FREE", "TOTAL", "DESCRIPTION")]
    for device in found:
        rows.append(
            (
                str(device.index),
                device.name,
                device.type,
                mib(device.memory_free),
                mib(device.memory_total),
                device.description,
            )
        )
    echo_table(rows)
