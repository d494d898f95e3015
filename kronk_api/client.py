"""Command-line calls to a running server: JSON over HTTP, with a bearer token when given."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import click


def call_server(
    api_host: str,
    method: str,
    path: str,
    *,
    token: str | None = None,
    body: dict[str, Any] | None = None,
    absent_ok: bool = False,
) -> Any:
    """The decoded JSON answer; a refusal or an unreachable server becomes the CLI's error.

    With `absent_ok`, no server listening there is None instead.
    """
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        f"http://{api_host}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers=headers,
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise click.ClickException(_error_message(exc)) from None
    except urllib.error.URLError as exc:
        if absent_ok and isinstance(exc.reason, ConnectionRefusedError):
            return None
        raise click.ClickException(f"cannot reach the server at {api_host}: {exc.reason}") from None
    except OSError as exc:  # the connection dropped mid-answer
        raise click.ClickException(f"cannot reach the server at {api_host}: {exc}") from None


def _error_message(exc: urllib.error.HTTPError) -> str:
    """`401: missing bearer token ...`: the status and the server's own message."""
    try:
        return f"{exc.code}: {json.loads(exc.read())['error']['message']}"
    except (ValueError, KeyError, TypeError):
        return f"{exc.code}: {exc.reason}"
