"""A pull on the terminal: one progress bar with bytes, speed and time left (rich)."""

from __future__ import annotations

import asyncio

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from kronk_catalog.download import Downloader
from kronk_catalog.pulls import Pull


async def pull_with_progress(pull: Pull, downloader: Downloader, console: Console) -> None:
    """Run `pull`, drawing its progress; raise its error, if it failed."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task(pull.model, total=pull.total_bytes)
        runner = asyncio.ensure_future(pull.run(downloader))
        try:
            async for snapshot in pull.watch():
                progress.update(
                    bar, completed=snapshot["done_bytes"], total=snapshot["total_bytes"]
                )
        finally:
            if not runner.done():  # stopped early (Ctrl-C): stop the download, keep its partial
                runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
    if pull.error is not None:
        raise pull.error
