"""Session affinity for a balancer in front of several Kronk servers (docs/deployment.md).

A conversation's KV lives in one server's slots, so its turns should land on one
server. `X-Kronk-Session` names the conversation: the client's value when it sends
one, else one derived from what identifies the conversation (the authenticated
subject and a hash of its system prompt and first user message, which every turn
repeats). Chat-like responses echo it, so a client that sends back what it got (an
SDK with default headers) is routed by it from its second request on. Every response
also names the server that answered (`X-Kronk-Replica`: its api_host).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send

from kronk_api.endpoints import SUBJECT_STATE

SESSION_HEADER = b"x-kronk-session"
REPLICA_HEADER = b"x-kronk-replica"
# The routes that carry a conversation; their responses carry the session.
CHAT_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/responses", "/v1/messages", "/api/chat", "/api/generate"}
)
# A client's session id is echoed as given, within reason.
MAX_SESSION_LENGTH = 128
# The body is copied for hashing only this far; a conversation's start is at its beginning
# unless the client puts huge fields first, and then the key is derived from what was seen.
MAX_HASHED_BODY = 1 << 20


def derive_session(subject: str | None, body: Any) -> str | None:
    """A conversation's key: the same for every turn of it, None for a body without one.

    What every turn repeats: the system prompt (a field or system messages before the
    first user message) and the first user message, under the caller's subject (two
    tenants with the same opening are two sessions).
    """
    if not isinstance(body, dict):
        return None
    system = body.get("system") or body.get("instructions")
    turns = body.get("messages")
    if turns is None:
        turns = body.get("input", body.get("prompt"))
    opening: list[Any] = []
    if isinstance(turns, str):
        opening.append(turns)
    elif isinstance(turns, list):
        for turn in turns:
            opening.append(turn)
            if isinstance(turn, dict) and turn.get("role", "user") == "user":
                break
    if system is None and not opening:
        return None
    identity = json.dumps([subject, system, opening], sort_keys=True, default=str)
    return hashlib.sha256(identity.encode()).hexdigest()[:32]


def affinity(replica: str) -> Any:
    """ASGI middleware factory: the session and replica headers (see the module)."""

    def wrap(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != ScopeType.HTTP:
                await app(scope, receive, send)
                return
            chat = scope["method"] == "POST" and scope["path"] in CHAT_PATHS
            given = dict(scope["headers"]).get(SESSION_HEADER, b"")[:MAX_SESSION_LENGTH]
            body = bytearray()

            async def receive_copy() -> ReceiveMessage:
                message = await receive()
                if chat and not given and message["type"] == "http.request":
                    room = MAX_HASHED_BODY - len(body)
                    body.extend(message.get("body", b"")[: max(room, 0)])
                return message

            async def send_with_headers(message: Message) -> None:
                if message["type"] == "http.response.start":
                    headers = list(message.get("headers", []))
                    headers.append((REPLICA_HEADER, replica.encode("latin-1")))
                    # Derived only for an answer: a refused body (too deep, too big) is
                    # not parsed again here.
                    derive = chat and not given and message["status"] < 400
                    session = given or (_derived(scope, bytes(body)) if derive else b"")
                    if session:
                        headers.append((SESSION_HEADER, session))
                    message = {**message, "headers": headers}
                await send(message)

            await app(scope, receive_copy, send_with_headers)

        return middleware

    return wrap


def _derived(scope: Scope, body: bytes) -> bytes:
    # The guards ran before the response starts: the subject is known by now.
    subject = scope.get("state", {}).get(SUBJECT_STATE)
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):  # cut at MAX_HASHED_BODY
        parsed = None
    session = derive_session(subject if isinstance(subject, str) else None, parsed)
    return session.encode() if session else b""
