"""DNS rebinding: the service answers only its own Host names and trusted Origins."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from kronk_testing.mcp_session import RawFactory, ServiceFactory


def port_of(url: str) -> int:
    return int(url.rpartition(":")[2])


@pytest.mark.parametrize(
    "origin",
    [
        None,  # not a browser: curl, Cline, Kilo Code, the SDK's client
        "http://localhost:5173",  # a local web app
        "http://127.0.0.1:9000",
        "http://[::1]:8080",
    ],
)
def test_local_origins_open_a_session(
    mcp_service: ServiceFactory, raw: RawFactory, origin: str | None
) -> None:
    with mcp_service() as url:
        session = raw(url, {"Origin": origin} if origin else {})
        response = session.initialize()
        assert response.status_code == 200, response.text
        assert session.result("tools/list")["tools"][0]["name"] == "web_search"


@pytest.mark.parametrize(
    "origin",
    ["http://evil.example", "http://localhost.evil.example:9000", "null", "https://127.0.0.2"],
)
def test_a_foreign_origin_gets_403_and_no_session(
    mcp_service: ServiceFactory, raw: RawFactory, origin: str
) -> None:
    with mcp_service() as url:
        response = raw(url, {"Origin": origin}).initialize()
    assert response.status_code == 403
    assert "mcp-session-id" not in response.headers
    error = response.json()["error"]
    assert error["message"] == (
        f"Origin {origin!r} may not call this MCP service (mcp.allowed_origins)"
    )


def test_a_rebound_host_name_gets_421_on_every_method(
    mcp_service: ServiceFactory, raw: RawFactory
) -> None:
    """A page at evil.example, re-pointed at 127.0.0.1, sends its own name as Host."""
    with mcp_service() as url:
        port = port_of(url)
        session = raw(url)
        assert session.initialize().status_code == 200
        rebound = {"Host": f"evil.example:{port}", "Mcp-Session-Id": session.session_id or ""}
        posted = httpx.post(url, json={}, headers={**rebound, "Accept": "application/json"})
        streamed = httpx.get(url, headers={**rebound, "Accept": "text/event-stream"})
        deleted = httpx.delete(url, headers=rebound)
        still_open = session.result("tools/list")
    for response in (posted, streamed, deleted):
        assert response.status_code == 421, response.text
        assert "is not a name of this MCP service (mcp.allowed_hosts)" in response.text
    assert still_open["tools"]


def test_configured_origins_and_hosts_are_let_in(
    mcp_service: ServiceFactory, raw: RawFactory
) -> None:
    settings = {
        "allowed_origins": ["https://app.example.com", "https://ide.example.com:*"],
        "allowed_hosts": ["kronk.lan"],
    }
    with mcp_service(**settings) as url:
        port = port_of(url)
        codes = {
            origin: raw(url, {"Origin": origin}).initialize().status_code
            for origin in (
                "https://app.example.com",
                "https://app.example.com:8443",
                "https://ide.example.com:3000",
                "http://ide.example.com:3000",
            )
        }
        lan = raw(url, {"Host": f"kronk.lan:{port}"}).initialize().status_code
        other = raw(url, {"Host": f"kronk.example:{port}"}).initialize().status_code
    assert codes == {
        "https://app.example.com": 200,
        "https://app.example.com:8443": 403,
        "https://ide.example.com:3000": 200,
        "http://ide.example.com:3000": 403,
    }
    assert (lan, other) == (200, 421)


PREFLIGHT = {
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type, mcp-session-id",
}


def test_browsers_of_trusted_origins_get_cors_answers(
    mcp_service: ServiceFactory, raw: RawFactory
) -> None:
    """The MCP Inspector runs in a browser at http://localhost:6274."""
    inspector = "http://localhost:6274"
    with mcp_service() as url:
        preflight = httpx.options(url, headers={"Origin": inspector, **PREFLIGHT})
        foreign = httpx.options(url, headers={"Origin": "http://evil.example", **PREFLIGHT})
        initialized = raw(url, {"Origin": inspector}).initialize()
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == inspector
    allowed = preflight.headers["access-control-allow-headers"].lower()
    assert "authorization" in allowed and "mcp-session-id" in allowed
    assert foreign.status_code == 403
    assert initialized.headers["access-control-allow-origin"] == inspector
    assert "mcp-session-id" in initialized.headers["access-control-expose-headers"].lower()
