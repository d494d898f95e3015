"""How a route tells guards what it is: the `kronk_endpoint` key of its handler's `opt`.

    @post("/v1/chat/completions", opt={ENDPOINT_OPT: "chat-completions"})

The value is a grant name (what a token's `endpoints` claim lists and what
rate limits count) or one of the access levels below. With auth on, a route
without the key is for admin tokens only, so a dialect that forgets it fails
closed.

A guard that authenticates tells the routes who is asking by putting the
caller's subject into the request's state under SUBJECT_STATE; the dialects
pass it to the SDK (`subject_of`), so caches keep callers apart.
"""

from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection
from litestar.types import Scope

ENDPOINT_OPT = "kronk_endpoint"

# Open to everyone, even with auth on (health checks).
PUBLIC = "public"
# Any valid token, whatever it grants; no quota (model listing).
AUTHENTICATED = "authenticated"
# Admin tokens only (operator routes under /v1/kronk/).
ADMIN = "admin"

ACCESS_LEVELS = frozenset({PUBLIC, AUTHENTICATED, ADMIN})

SUBJECT_STATE = "kronk_subject"


def subject_of(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    """The authenticated caller's subject; None when no guard authenticated the request."""
    subject = connection.state.get(SUBJECT_STATE)
    return subject if isinstance(subject, str) else None


def route_path(scope: Scope) -> str:
    """The route a request matched, as declared (`/v1/models/{model_id:str}`)."""
    return str(scope.get("path_template") or scope.get("path", ""))


def endpoint_name(scope: Scope) -> str:
    """What observability calls a request's endpoint: its grant name, else its route."""
    handler = scope.get("route_handler")
    name = handler.opt.get(ENDPOINT_OPT) if handler is not None else None
    return name if isinstance(name, str) and name not in ACCESS_LEVELS else route_path(scope)
