"""How the commands print: aligned tables, sizes in MiB."""

from __future__ import annotations

from collections.abc import Sequence

import click


def echo_table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        line = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        click.echo(line.rstrip())


def mib(count: int) -> str:
    return f"{count / 2**20:.1f} MiB"
