"""Who may use the MCP endpoint: Host and Origin checks (DNS rebinding), then the token gate.

The MCP transport specification requires servers to validate Origin: a web
page whose name an attacker re-points at 127.0.0.1 must not reach a local
service. Browsers always send Origin on the POSTs that carry MCP messages;
the Host check also covers a same-origin GET, which carries none. Clients
that are not browsers send no Origin and the service's own address as Host.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Protocol
from urllib.parse import urlsplit

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kronk_core.contract import KronkError, RequestTooLargeError
from kronk_mcp.settings import LOOPBACK

WILDCARD = ("", "0.0.0.0", "::")
# JSON-RPC's "invalid request", with no request id: what the MCP SDK answers HTTP errors with.
INVALID_REQUEST = -32600


class Gate(Protocol):
    """The token check, when the model server has auth on."""

    async def admit(self, authorization: str | None, tool_calls: int) -> str:
        """The token's subject, once it is valid, grants `mcp`, and `tool_calls` calls are counted.

        Raise KronkError (401, 403, 429 with retry_after, 503) to refuse.
        """
        ...


def _hostname(value: str) -> tuple[str, str]:
    """`Host` header or allowed entry → (lower-case name without brackets, port or "")."""
    parts = urlsplit(f"//{value}")
    try:
        port = "" if parts.port is None else str(parts.port)
    except ValueError:
        return "", ""  # not a port: no name, which matches nothing
    return (parts.hostname or "").lower(), port


class Addresses:
    """The Host names and Origins the service answers, from its listen address and settings."""

    def __init__(
        self, listen_host: str, extra_hosts: Iterable[str], extra_origins: Iterable[str]
    ) -> None:
        names = [*LOOPBACK]
        if listen_host not in WILDCARD:
            names.append(listen_host.lower())
        self._hosts = [(name, "") for name in names] + [_hostname(h) for h in extra_hosts]
        self._names = names
        self._origins = list(extra_origins)

    def allows_host(self, host: str | None) -> bool:
        if not host:
            return False
        name, port = _hostname(host)
        return any(name == n and p in ("", port) for n, p in self._hosts)

    def allows_origin(self, origin: str | None) -> bool:
        if origin is None:
            return True  # not a browser
        parts = urlsplit(origin)
        if parts.scheme in ("http", "https") and (parts.hostname or "") in self._names:
            return True
        for allowed in self._origins:
            if allowed == origin or (allowed.endswith(":*") and origin.startswith(allowed[:-1])):
                return True
        return False


def _tool_calls(body: bytes) -> int:
    """How many tools/call requests a POST carries (a JSON-RPC batch may hold several)."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return 0  # the MCP transport answers it with a parse error
    messages = message if isinstance(message, list) else [message]
    return sum(1 for m in messages if isinstance(m, dict) and m.get("method") == "tools/call")


async def _read_body(receive: Receive, limit: int) -> bytes:
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return bytes(body)
        body += message.get("body", b"")
        if len(body) > limit:
            raise RequestTooLargeError(f"request body is larger than {limit} bytes")
        if not message.get("more_body", False):
            return bytes(body)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def refuse(
    send: Send, status: int, message: str, headers: Iterable[tuple[str, str]] = ()
) -> None:
    """An HTTP error with a JSON-RPC error body, as the MCP SDK's transport sends them."""
    body = json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": message}}
    ).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(name.encode(), value.encode()) for name, value in headers]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _error_headers(error: KronkError) -> list[tuple[str, str]]:
    headers = []
    if error.status == 401:
        headers.append(("www-authenticate", 'Bearer realm="kronk-mcp"'))
    if error.retry_after is not None:
        headers.append(("retry-after", str(error.retry_after)))
    return headers


class AddressGuard:
    """ASGI middleware: only this service's Host names and trusted Origins get through."""

    def __init__(self, app: ASGIApp, addresses: Addresses) -> None:
        self.app = app
        self.addresses = addresses

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            host, origin = headers.get("host"), headers.get("origin")
            if not self.addresses.allows_host(host):
                message = f"Host {host!r} is not a name of this MCP service (mcp.allowed_hosts)"
                await refuse(send, 421, message)
                return
            if not self.addresses.allows_origin(origin):
                message = f"Origin {origin!r} may not call this MCP service (mcp.allowed_origins)"
                await refuse(send, 403, message)
                return
        await self.app(scope, receive, send)


class TokenGuard:
    """ASGI middleware: a token the gate admits, with the POST's tool calls counted.

    Sessions belong to the token's subject.
    """

    def __init__(
        self, app: ASGIApp, gate: Gate, max_body: int = DEFAULT_MAX_REQUEST_BODY_SIZE
    ) -> None:
        self.app = app
        self.gate = gate
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                receive = await self._admit(scope, receive)
            except KronkError as exc:
                await refuse(send, exc.status, exc.message, _error_headers(exc))
                return
        await self.app(scope, receive, send)

    async def _admit(self, scope: Scope, receive: Receive) -> Receive:
        calls = 0
        if scope["method"] == "POST":
            body = await _read_body(receive, self.max_body)
            calls = _tool_calls(body)
            receive = _replay(body, receive)
        subject = await self.gate.admit(Headers(scope=scope).get("authorization"), calls)
        # The SDK ties each session to the credential that opened it.
        token = AccessToken(token="", client_id=subject, scopes=["mcp"], subject=subject)
        scope["user"] = AuthenticatedUser(token)
        return receive
