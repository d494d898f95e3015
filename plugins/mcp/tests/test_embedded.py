"""The MCP service the model server starts and stops, with auth on: tokens, grants, quotas.

The model server runs its real startup and shutdown (its lifespan) on an
event loop of its own; the MCP service it starts is real uvicorn on a
loopback port.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import socket
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import httpx2
import mcp_types as types
import pytest
from anyio.from_thread import start_blocking_portal
from cryptography.hazmat.primitives.asymmetric.padding import PKCS1v15
from cryptography.hazmat.primitives.hashes import SHA256
from litestar.datastructures import State
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from kronk_api import ServerSettings, create_app
from kronk_auth_jwt.tokens import issue, open_key_store, parse_endpoints
from kronk_core import Kronk, KronkConfig
from kronk_core.contract.errors import ConfigError
from kronk_mcp.plugin import STATE_KEY
from kronk_mcp.service import BackgroundService
from kronk_mcp.service import _bind as bind_service
from kronk_mcp.settings import DEFAULT_LISTEN

if TYPE_CHECKING:
    from kronk_testing.brave_search import BraveSearchDouble
    from kronk_testing.mcp_session import RawFactory


@contextlib.contextmanager
def model_server(base: Path, sections: dict[str, Any]) -> Iterator[State]:
    """A model server's startup and shutdown (no model is loaded), on a loop of its own."""
    settings = ServerSettings(base_path=base, sections=sections)
    app = create_app(settings, kronk=Kronk(KronkConfig(base_path=base)))
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(app.lifespan()):
        yield app.state


def mcp_section(brave: BraveSearchDouble, listen: str = "127.0.0.1:0") -> dict[str, Any]:
    return {"listen": listen, "braveapikey": brave.key, "brave_url": brave.base_url}


def service_url(state: State) -> str:
    """Where the server's MCP service listens (it was given port 0: a free one)."""
    service: BackgroundService = state[STATE_KEY]
    return f"http://{service.address}"


def token(base: Path, endpoints: str) -> str:
    keys = open_key_store(base / "keys", "kronk")
    return issue(keys, "kronk", timedelta(hours=1), parse_endpoints(endpoints))


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


@contextlib.contextmanager
def auth_on(tmp_path: Path, brave: BraveSearchDouble) -> Iterator[str]:
    sections = {"auth-jwt": {"enabled": True}, "mcp": mcp_section(brave)}
    with model_server(tmp_path, sections) as state:
        yield service_url(state)


def test_without_a_valid_token_the_endpoint_answers_401(
    tmp_path: Path, brave: BraveSearchDouble
) -> None:
    with auth_on(tmp_path, brave) as url, httpx.Client() as http:
        initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}
        missing = http.post(url, json=initialize)
        forged = http.post(url, json=initialize, headers=bearer("not.a.jwt"))
        listed = http.post(
            url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=bearer("x")
        )
    for response in (missing, forged, listed):
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert "mcp-session-id" not in response.headers
    assert missing.json()["error"]["message"].startswith("missing bearer token")
    assert forged.json()["error"]["message"] == "malformed bearer token"
    assert brave.requests == []


def _signed_raw(base: Path, header: Any, claims: Any) -> str:
    """Any JSON as a token's header and claims, signed with the server's real signing key."""
    keys = open_key_store(base / "keys", "kronk")
    kid = keys.signing_key_id()

    def b64(value: Any) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    header = {"alg": "RS256", "kid": kid} if header is None else header
    signing_input = f"{b64(header)}.{b64(claims)}"
    signature = keys.private_key(kid).sign(signing_input.encode(), PKCS1v15(), SHA256())
    return f"{signing_input}.{base64.urlsafe_b64encode(signature).rstrip(b'=').decode()}"


def test_every_malformed_token_is_401(tmp_path: Path, brave: BraveSearchDouble) -> None:
    now = int(time.time())
    # Valid claims that grant another endpoint: signed under a proper header, a 403.
    claims = {"iss": "kronk", "sub": "someone", "exp": now + 3600, "endpoints": {"tokenize": {}}}
    headers: list[Any] = [
        {"alg": "RS256", "kid": 1},
        {"alg": "RS256", "kid": None},
        {"alg": "RS256", "kid": ["x"]},
        {"alg": "RS256", "kid": "x", "crit": ["exp"]},
        {"alg": "RS256", "crit": "exp"},
        "RS256",
        [],
    ]
    initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}
    with auth_on(tmp_path, brave) as url, httpx.Client() as http:
        malformed = [_signed_raw(tmp_path, header, claims) for header in headers]
        malformed += [_signed_raw(tmp_path, None, body) for body in ([claims], 7)]
        malformed.append(_signed_raw(tmp_path, None, {**claims, "sub": 1}))
        for token in malformed:
            response = http.post(url, json=initialize, headers=bearer(token))
            assert response.status_code == 401, (token, response.text)
            assert response.json()["error"]["message"], response.text
        granted_elsewhere = _signed_raw(tmp_path, None, claims)
        control = http.post(url, json=initialize, headers=bearer(granted_elsewhere))
        assert control.status_code == 403, control.text
    assert brave.requests == []


def test_browsers_get_refusals_they_can_read_and_preflights_need_no_token(
    tmp_path: Path, brave: BraveSearchDouble
) -> None:
    inspector = {"Origin": "http://localhost:6274"}
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization",
    }
    with auth_on(tmp_path, brave) as url:
        checked = httpx.options(url, headers={**inspector, **preflight})
        refused = httpx.post(url, json={}, headers=inspector)
    assert checked.status_code == 200
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == inspector["Origin"]
    assert "www-authenticate" in refused.headers["access-control-expose-headers"].lower()


def test_a_token_needs_the_mcp_grant(tmp_path: Path, brave: BraveSearchDouble) -> None:
    with auth_on(tmp_path, brave) as url, httpx.Client() as http:
        chat_only = token(tmp_path, "chat-completions")
        response = http.post(url, json={}, headers=bearer(chat_only))
    assert response.status_code == 403
    assert response.json()["error"]["message"] == "token does not grant the 'mcp' endpoint"


def test_the_official_client_works_with_a_granted_token(
    tmp_path: Path, brave: BraveSearchDouble
) -> None:
    async def use(url: str, granted: str) -> tuple[types.ListToolsResult, types.CallToolResult]:
        async with (
            httpx2.AsyncClient(headers=bearer(granted), timeout=30) as http,
            Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
        ):
            tools = await client.list_tools()
            return tools, await client.call_tool("web_search", {"query": "kronk", "count": 1})

    with auth_on(tmp_path, brave) as url:
        tools, result = asyncio.run(use(url, token(tmp_path, "mcp")))
    assert [tool.name for tool in tools.tools] == ["web_search"]
    assert not result.is_error
    assert isinstance(result.content[0], types.TextContent)
    assert "https://example.com/kronk/1" in result.content[0].text


def test_quota_counts_tool_calls_per_subject(
    tmp_path: Path, brave: BraveSearchDouble, raw: RawFactory
) -> None:
    with auth_on(tmp_path, brave) as url:
        limited = token(tmp_path, "mcp:2/day")
        other = token(tmp_path, "mcp:2/day")
        admin = (tmp_path / "keys" / "master.jwt").read_text().strip()
        session = raw(url, bearer(limited))
        assert session.initialize().status_code == 200
        session.result("tools/list")  # not a tool call: not counted
        arguments = {"name": "web_search", "arguments": {"query": "q"}}
        answers = [session.call("tools/call", arguments) for _ in range(3)]
        still_listed = session.call("tools/list")
        fresh = raw(url, bearer(other))
        fresh.initialize()
        other_subject = fresh.call("tools/call", arguments)
        by_admin = raw(url, bearer(admin))
        by_admin.initialize()
        admin_calls = [by_admin.call("tools/call", arguments).status_code for _ in range(3)]
    assert [answer.status_code for answer in answers] == [200, 200, 429]
    refused = answers[2]
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["message"] == "quota of 2 mcp requests per day used up"
    assert still_listed.status_code == 200
    assert other_subject.status_code == 200
    assert admin_calls == [200, 200, 200]
    assert len(brave.requests) == 6


def test_a_session_belongs_to_the_token_that_opened_it(
    tmp_path: Path, brave: BraveSearchDouble, raw: RawFactory
) -> None:
    with auth_on(tmp_path, brave) as url:
        owner = raw(url, bearer(token(tmp_path, "mcp")))
        owner.initialize()
        intruder = raw(url, bearer(token(tmp_path, "mcp")))
        intruder.session_id = owner.session_id
        stolen = intruder.call("tools/list")
        kept = owner.call("tools/list")
    assert stolen.status_code == 404
    assert kept.status_code == 200


def test_the_service_stops_with_the_server(tmp_path: Path, brave: BraveSearchDouble) -> None:
    async def search(url: str) -> types.CallToolResult:
        async with Client(url, mode="legacy") as client:
            return await client.call_tool("web_search", {"query": "up"})

    with model_server(tmp_path, {"mcp": mcp_section(brave)}) as state:
        url = service_url(state)
        assert not asyncio.run(search(url)).is_error
    with pytest.raises(httpx.ConnectError):
        httpx.post(url, json={})


def test_an_external_host_means_no_embedded_service(
    tmp_path: Path, brave: BraveSearchDouble
) -> None:
    section = {**mcp_section(brave), "host": "mcp.example.com:9000"}
    with model_server(tmp_path, {"mcp": section}) as state:
        assert STATE_KEY not in state


def test_a_configured_address_in_use_stops_the_server(
    tmp_path: Path, brave: BraveSearchDouble
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        with (
            pytest.raises(ExceptionGroup) as failed,  # Litestar runs the startup in a task group
            model_server(tmp_path, {"mcp": mcp_section(brave, listen)}),
        ):
            pass
    assert failed.group_contains(ConfigError, match=rf"^mcp\.listen: cannot listen on {listen}: ")


def test_the_default_address_in_use_leaves_the_models_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The default port may be another Kronk's service: the model server starts anyway."""
    host, port = DEFAULT_LISTEN.split(":")
    with socket.socket() as holder:
        with contextlib.suppress(OSError):  # someone else may hold it already: taken either way
            holder.bind((host, int(port)))
            holder.listen()
        caplog.set_level(logging.ERROR, logger="kronk_mcp")
        with model_server(tmp_path, {}):
            pass
    assert f"mcp: no MCP service: cannot listen on {DEFAULT_LISTEN}" in caplog.text


def test_two_servers_racing_for_one_address_leave_no_half_bound_service() -> None:
    """Another server bound the port (SO_REUSEADDR, as the service binds) but had not listened
    yet: the service's bind listens at once, so the other one is refused there, and the
    service never learns of the conflict later, inside uvicorn's thread."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.1", 0))
        with bind_service(f"127.0.0.1:{other.getsockname()[1]}"), pytest.raises(OSError):
            other.listen()
