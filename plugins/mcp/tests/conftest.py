"""The MCP plugin's fixtures: the Brave Search double (kronk_testing.brave_search), the MCP
service in-process, and plain-HTTP sessions (kronk_testing.mcp_session)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kronk_mcp.service import BackgroundService, mcp_app
from kronk_mcp.settings import McpSettings
from kronk_testing.brave_search import BraveSearchDouble
from kronk_testing.mcp_session import RawFactory, RawSession, ServiceFactory


@pytest.fixture
def brave() -> Iterator[BraveSearchDouble]:
    double = BraveSearchDouble()
    yield double
    double.close()


@pytest.fixture
def mcp_service(brave: BraveSearchDouble) -> ServiceFactory:
    """`with mcp_service(**settings) as url:` the MCP service on a free loopback port.

    Settings default to the Brave double and its key; the service is the one
    `kronk server start` and `kronk mcp start` run, without a token check.
    """

    @contextlib.contextmanager
    def start(**overrides: Any) -> Iterator[str]:
        values: dict[str, Any] = {
            "listen": "127.0.0.1:0",
            "braveapikey": brave.key,
            "brave_url": brave.base_url,
            **overrides,
        }
        settings = McpSettings.model_validate(values)
        service = BackgroundService(mcp_app(settings, gate=None), settings.listen)
        service.start()
        try:
            yield f"http://{service.address}"
        finally:
            service.stop()

    return start


@pytest.fixture
def raw() -> Iterator[RawFactory]:
    """`raw(url, headers={...})`: a RawSession on a shared HTTP client."""
    with httpx.Client(timeout=30) as http:
        yield lambda url, headers=None: RawSession(http, url, dict(headers or {}))
