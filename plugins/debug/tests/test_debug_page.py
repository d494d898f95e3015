"""The debug server's page (/debug/view) in Chromium: live charts of the process, a CPU
profile of a running server summed by function, the allocations of a window, every
thread's stack; and with authentication on, the data only with the admin token."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from playwright.sync_api import Page, expect

from kronk_api import ServerSettings, create_app
from kronk_testing.auth import admin_token
from kronk_testing.plugin import ScriptedKronk
from kronk_testing.server import Serve

if TYPE_CHECKING:
    from kronk_core import Kronk

# Chromium runs as a process of its own: the full tier.
pytestmark = pytest.mark.process


def debug_server(
    serve: Serve, kronk: Kronk, base: Path, host: str, port: int, **sections: object
) -> Iterator[str]:
    settings = ServerSettings.model_validate(
        {"base_path": base, "debug": {"host": f"{host}:{port}"}, **sections}
    )
    with serve(create_app(settings, kronk=kronk), lifespan="on"):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
def debug_url(
    scripted_kronk: ScriptedKronk, serve: Serve, tmp_path: Path, port_finder: Callable[[], int]
) -> Iterator[str]:
    yield from debug_server(serve, scripted_kronk(), tmp_path, "127.0.0.1", port_finder())


def test_the_page_charts_the_process_and_shows_a_profile_allocations_and_stacks(
    debug_url: str, page: Page
) -> None:
    figures = httpx.get(f"{debug_url}/debug/process").json()
    assert figures["rss_bytes"] > 10 << 20 and figures["threads"] >= 2
    assert figures["cpu_seconds"] > 0 and figures["loop_lag_max_seconds"] >= 0
    page.goto(f"{debug_url}/debug/view")
    # Two polls: every chart has points, the CPU chart once there is a difference.
    for chart in ("rss", "lag", "threads", "cpu"):
        expect(page.locator(f"#chart-{chart}")).not_to_have_attribute("data-points", "0")
    page.fill("#cpu-seconds", "1")
    page.click("#cpu-run")
    rows = page.locator("#cpu-top tbody tr")
    expect(rows.first).to_be_visible(timeout=15_000)
    # The servers' threads (uvicorn's) are among the functions sampled.
    expect(page.locator("#cpu-top")).to_contain_text("Server.run")
    expect(page.locator("#cpu-folded")).to_be_visible()
    page.fill("#memory-seconds", "1")
    page.click("#memory-run")
    expect(page.locator("#memory-out")).to_contain_text("allocation sites hold", timeout=15_000)
    page.click("#threads-run")
    expect(page.locator("#threads-out")).to_contain_text("thread MainThread")


def test_off_loopback_with_authentication_the_page_needs_the_admin_token(
    scripted_kronk: ScriptedKronk,
    serve: Serve,
    tmp_path: Path,
    port_finder: Callable[[], int],
    page: Page,
) -> None:
    auth = {"auth-jwt": {"enabled": True}}
    # Off loopback: there the debug server asks for an admin token (on loopback, none).
    kronk = scripted_kronk()
    for url in debug_server(serve, kronk, tmp_path, "0.0.0.0", port_finder(), **auth):
        assert httpx.get(f"{url}/debug/view").status_code == 200  # the page holds no data
        assert httpx.get(f"{url}/debug/process").status_code == 401
        page.goto(f"{url}/debug/view")
        expect(page.locator("#error")).to_contain_text("HTTP 401")
        page.fill("#token", admin_token(tmp_path))
        page.dispatch_event("#token", "change")
        page.click("#threads-run")
        expect(page.locator("#threads-out")).to_contain_text("thread MainThread")
