"""`kronk plugins`."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from kronk_api.plugin_list import describe_plugins
from kronk_core import Kronk, KronkConfig


@click.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text")
def plugins(as_json: bool) -> None:
    """List installed plugins: what each provides and whether configuration disabled it."""
    with Kronk(KronkConfig()) as kronk:
        reports = describe_plugins(kronk)
    if as_json:
        click.echo(json.dumps([asdict(report) for report in reports], indent=2))
        return
    for report in reports:
        where = f" ({report.distribution})" if report.distribution else ""
        if not report.active:
            click.echo(f"{report.name}{where}: disabled by configuration")
            continue
        click.echo(f"{report.name}{where}")
        click.echo(f"  hooks: {', '.join(report.hooks) or 'none'}")
        for kind, names in report.registered.items():
            click.echo(f"  {kind}: {', '.join(names)}")
        for level, names in report.settings.items():
            click.echo(f"  {level} settings: {', '.join(names)}")
