"""The catalog commands against a running server, the Kronk manual's web mode: the server
lists, pulls and updates with its own base path, Hub and catalog source, and the command
prints what it would print on this machine's files.

A command works on the server when `--api-host` (or KRONK_API_HOST) names one, or when
one answers at the default address; with `--local` or `--base-path`, or with no server
there, it works on this machine's files.
"""

from __future__ import annotations

import json
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import click

from kronk_api.contract import call_server

DEFAULT_API_HOST = "127.0.0.1:8080"
# How long a pull's events may go quiet (the server sends keep-alive comments meanwhile).
_EVENTS_TIMEOUT = 120.0


@dataclass(frozen=True)
class Server:
    """A running server and the admin token its catalog routes need (when auth is on)."""

    api_host: str
    token: str | None

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return call_server(self.api_host, method, path, token=self.token, body=body)

    def events(self, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """A server-sent event stream's (event, data) pairs."""
        headers = {"Accept": "text/event-stream"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(f"http://{self.api_host}{path}", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=_EVENTS_TIMEOUT) as response:
                event = "message"
                for raw in response:
                    line = raw.decode().rstrip("\r\n")
                    if line.startswith("event:"):
                        event = line.removeprefix("event:").strip()
                    elif line.startswith("data:"):
                        yield event, json.loads(line.removeprefix("data:"))
                        event = "message"
        except (urllib.error.URLError, OSError) as exc:
            raise click.ClickException(
                f"lost the server at {self.api_host} while following the pull: {exc}"
            ) from None


def answers_at(api_host: str) -> bool:
    host, _, port = api_host.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except (OSError, ValueError):
        return False


def server_for(
    *, local: bool, base_path_given: bool, api_host: str | None, token: str | None
) -> Server | None:
    """The server a catalog command talks to, or None to work on this machine's files."""
    if local or base_path_given:
        return None
    if api_host is not None:
        return Server(api_host, token)
    return Server(DEFAULT_API_HOST, token) if answers_at(DEFAULT_API_HOST) else None


def pull_on(server: Server, body: dict[str, Any]) -> dict[str, Any]:
    """Start a pull on the server and follow it to its end: progress on stderr, the last
    snapshot returned (ClickException if it failed)."""
    started: dict[str, Any] = server.call("POST", "/v1/kronk/pulls", body)
    last = started
    shown = -1.0
    for event, snapshot in server.events(f"/v1/kronk/pulls/{started['id']}/events"):
        last = snapshot
        percent = snapshot.get("percent")
        if event == "progress" and percent is not None and percent >= shown + 5:
            shown = percent
            print(f"pulling {snapshot['model']}: {percent:.0f}%", file=sys.stderr)
        if event in ("done", "failed"):
            break
    if last["status"] != "done":
        error = last.get("error") or {}
        raise click.ClickException(
            f"pulling {last['model']} on the server failed: {error.get('message', last['status'])}"
        )
    return last
