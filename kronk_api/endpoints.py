"""How a route tells guards what it is: the `kronk_endpoint` key of its handler's `opt`.

    @post("/v1/chat/completions", opt={ENDPOINT_OPT: "chat-completions"})

The value is a grant name (what a token's `endpoints` claim lists and what
rate limits count) or one of the access levels below. With auth on, a route
without the key is for admin tokens only, so a dialect that forgets it fails
closed.
"""

from __future__ import annotations

from litestar.types import Scope

ENDPOINT_OPT = "kronk_endpoint"

# Open to everyone, even with auth on (health checks).
PUBLIC = "public"
# Any valid token, whatever it grants; no quota (model listing).
AUTHENTICATED = "authenticated"
# Admin tokens only (operator routes under /v1/kronk/).
ADMIN = "admin"

ACCESS_LEVELS = frozenset({PUBLIC, AUTHENTICATED, ADMIN})


def route_path(scope: Scope) -> str:
    """The route a request matched, as declared (`/v1/models/{model_id:str}`)."""
    return str(scope.get("path_template") or scope.get("path", ""))


def endpoint_name(scope: Scope) -> str:
    """What observability calls a request's endpoint: its grant name, else its route."""
    handler = scope.get("route_handler")
    name = handler.opt.get(ENDPOINT_OPT) if handler is not None else None
    return name if isinstance(name, str) and name not in ACCESS_LEVELS else route_path(scope)
