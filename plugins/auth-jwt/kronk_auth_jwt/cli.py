"""`kronk security key|token ...`: on the running server (admin token) or the files (--local)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from kronk_auth_jwt.keys import KeyStore
from kronk_auth_jwt.tokens import issue, open_key_store, parse_duration, parse_endpoints
from kronk_core.config import default_base_path
from kronk_core.errors import KronkError

F = TypeVar("F", bound=Callable[..., Any])


def _target_options(command: F) -> F:
    """Where a command acts: the server at --api-host, or the key files with --local."""
    options = [
        click.option("--local", is_flag=True, help="Work on the key files, not the running server"),
        click.option(
            "--base-path",
            envvar="KRONK_BASE_PATH",
            type=click.Path(path_type=Path),
            help="With --local: the server's base directory [~/.kronk]",
        ),
        click.option(
            "--auth-issuer",
            envvar="KRONK_AUTH_ISSUER",
            default="kronk",
            show_default=True,
            help="With --local: the issuer (iss) the server checks",
        ),
        click.option(
            "--api-host",
            envvar="KRONK_WEB_API_HOST",
            default="127.0.0.1:8080",
            show_default=True,
            help="The running server, HOST:PORT",
        ),
        click.option("--token", envvar="KRONK_TOKEN", help="Admin token for the running server"),
    ]
    for option in reversed(options):
        command = option(command)
    return command


class _Target:
    def __init__(
        self,
        local: bool,
        base_path: Path | None,
        auth_issuer: str,
        api_host: str,
        token: str | None,
    ) -> None:
        self.local = local
        self.issuer = auth_issuer
        self._base = (base_path or default_base_path()).expanduser()
        self._api_host = api_host
        self._token = token

    def keys(self) -> KeyStore:
        return open_key_store(self._base / "keys", self.issuer)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One admin request to the running server; its error message becomes the CLI's."""
        if not self._token:
            raise click.ClickException(
                "set KRONK_TOKEN (or --token) to an admin token, or use --local"
            )
        request = urllib.request.Request(
            f"http://{self._api_host}/v1/kronk/security/{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise click.ClickException(_error_message(exc)) from None
        except urllib.error.URLError as exc:
            raise click.ClickException(f"cannot reach {self._api_host}: {exc.reason}") from None


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        return f"{exc.code}: {json.loads(exc.read())['error']['message']}"
    except (ValueError, KeyError, TypeError):
        return f"{exc.code}: {exc.reason}"


def _run(action: Callable[[], None]) -> None:
    try:
        action()
    except KronkError as exc:
        raise click.ClickException(exc.message) from None


def _echo_keys(keys: list[dict[str, str]]) -> None:
    click.echo(f"{'KEY ID':<40}CREATED")
    for key in keys:
        click.echo(f"{key['id']:<40}{key['created']}")


def add_commands(group: click.Group) -> None:
    @group.group("security")
    def security() -> None:
        """Authentication keys and tokens (servers started with --auth-enabled)."""

    @security.group("key")
    def key() -> None:
        """Signing keys: list, create, delete."""

    @key.command("list")
    @_target_options
    def key_list(**options: Any) -> None:
        """List signing keys."""
        target = _Target(**options)

        def action() -> None:
            if target.local:
                _echo_keys([info.as_dict() for info in target.keys().list()])
            else:
                _echo_keys(target.call("GET", "keys")["data"])

        _run(action)

    @key.command("create")
    @_target_options
    def key_create(**options: Any) -> None:
        """Create a signing key; new tokens are signed with the newest key."""
        target = _Target(**options)

        def action() -> None:
            if target.local:
                click.echo(target.keys().create().id)
            else:
                click.echo(target.call("POST", "keys")["id"])

        _run(action)

    @key.command("delete")
    @click.option("--keyid", required=True, help="The key to delete")
    @_target_options
    def key_delete(keyid: str, **options: Any) -> None:
        """Delete a key: every token it signed stops working. The master key stays."""
        target = _Target(**options)

        def action() -> None:
            if target.local:
                target.keys().delete(keyid)
            else:
                target.call("DELETE", f"keys/{keyid}")
            click.echo(f"deleted {keyid}")

        _run(action)

    @security.group("token")
    def token() -> None:
        """User tokens."""

    @token.command("create")
    @click.option("--duration", required=True, help="Lifetime, e.g. 1h, 24h, 720h, 8760h")
    @click.option(
        "--endpoints",
        required=True,
        help='Grants, e.g. "chat-completions:1000/day,embeddings:unlimited,rerank"',
    )
    @_target_options
    def token_create(duration: str, endpoints: str, **options: Any) -> None:
        """Create a user token; prints it alone on stdout."""
        target = _Target(**options)

        def action() -> None:
            if target.local:
                grants = parse_endpoints(endpoints)
                value = issue(target.keys(), target.issuer, parse_duration(duration), grants)
            else:
                body = {"duration": duration, "endpoints": endpoints}
                value = target.call("POST", "tokens", body)["token"]
            click.echo(value)

        _run(action)
