"""Debian's Chromium driven by Playwright, for the tests of pages (the UI, the debug page):
the `chromium`, `browser` and `page` fixtures of the harness's pytest plugin."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

# Chromium as the tests run it: no sandbox (root in a container), no network of its own.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    found = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(found).is_file():
        pytest.fail(
            "Debian's chromium is not installed; `nox -s full` installs it "
            "(apt-get install -y chromium) before the tests run"
        )
    return found


def launched_browser(chromium: str) -> Iterator[Browser]:
    """Debian's chromium, never a browser of Playwright's own; Playwright gives each launch
    a fresh profile (--user-data-dir). While Playwright's synchronous API is open its event
    loop counts as running, so the `browser` fixture is module-scoped: the async tests
    after a module's browser tests need it closed."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


def checked_page(browser: Browser) -> Iterator[Page]:
    """A page in a fresh context; any script error, or a console error other than a failed
    load, fails the test (a script the Content-Security-Policy blocked among them)."""
    context = browser.new_context(viewport={"width": 1280, "height": 820})
    opened = context.new_page()
    problems: list[str] = []
    opened.on("pageerror", lambda error: problems.append(str(error)))
    opened.on(
        "console",
        lambda message: (
            problems.append(message.text)
            if message.type == "error" and "Failed to load resource" not in message.text
            else None
        ),
    )
    yield opened
    context.close()
    assert problems == []
