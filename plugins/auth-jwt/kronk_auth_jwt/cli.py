"""`kronk security key|token ...`: on the running server (admin token) or the files (--local)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from kronk_api.contract import BoolValueGroup, call_server, other_spellings, setting_option
from kronk_auth_jwt.keys import KeyStore
from kronk_auth_jwt.settings import SETTINGS, AuthSettings
from kronk_auth_jwt.tokens import issue, open_key_store, parse_duration, parse_endpoints
from kronk_core.contract import KronkError, default_base_path

_TARGET_OPTIONS = ("local", "base_path", "auth_jwt_issuer", "api_host", "token")


def _on_target(command: Callable[..., None]) -> Callable[..., None]:
    """Give command the options that say where it acts, as a `_Target` first argument.

    A KronkError it raises (bad key id, bad duration) becomes the CLI's error.
    """

    @functools.wraps(command)
    def run(**options: Any) -> None:
        target = _Target(**{name: options.pop(name) for name in _TARGET_OPTIONS})
        try:
            command(target, **options)
        except KronkError as exc:
            raise click.ClickException(exc.message) from None

    decorated: Callable[..., None] = run
    for option in reversed(
        [
            click.option("--local", is_flag=True, help="Work on the key files, not the server"),
            setting_option(
                "base_path",
                type=click.Path(path_type=Path),
                help="With --local: the server's base directory [~/.kronk]",
            ),
            setting_option(
                "auth-jwt.issuer",
                others=other_spellings([SETTINGS]),
                help="With --local: the issuer (iss) the server checks [kronk]",
            ),
            setting_option("api_host", help="The running server, HOST:PORT [127.0.0.1:8080]"),
            click.option("--token", envvar="KRONK_TOKEN", help="Admin token for the server"),
        ]
    ):
        decorated = option(decorated)
    return decorated


class _Target:
    def __init__(
        self,
        local: bool,
        base_path: Path | None,
        auth_jwt_issuer: str | None,
        api_host: str | None,
        token: str | None,
    ) -> None:
        self.local = local
        self.issuer = auth_jwt_issuer or AuthSettings().issuer
        self._base = (base_path or default_base_path()).expanduser()
        self._api_host = api_host or "127.0.0.1:8080"
        self._token = token

    def keys(self) -> KeyStore:
        return open_key_store(self._base / "keys", self.issuer)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One admin request to the running server; its error message becomes the CLI's."""
        if not self._token:
            raise click.ClickException(
                "set KRONK_TOKEN (or --token) to an admin token, or use --local"
            )
        return call_server(
            self._api_host, method, f"/v1/kronk/security/{path}", token=self._token, body=body
        )


def _echo_keys(keys: list[dict[str, str]]) -> None:
    click.echo(f"{'KEY ID':<40}CREATED")
    for key in keys:
        click.echo(f"{key['id']:<40}{key['created']}")


@click.group("security", cls=BoolValueGroup)
def security() -> None:
    """Authentication keys and tokens (servers started with --auth-enabled)."""


@security.group("key")
def key() -> None:
    """Signing keys: list, create, delete."""


@key.command("list")
@_on_target
def key_list(target: _Target) -> None:
    """List signing keys."""
    if target.local:
        _echo_keys([info.as_dict() for info in target.keys().list()])
    else:
        _echo_keys(target.call("GET", "keys")["data"])


@key.command("create")
@_on_target
def key_create(target: _Target) -> None:
    """Create a signing key; new tokens are signed with the newest key."""
    if target.local:
        click.echo(target.keys().create().id)
    else:
        click.echo(target.call("POST", "keys")["id"])


@key.command("delete")
@click.option("--keyid", required=True, help="The key to delete")
@_on_target
def key_delete(target: _Target, keyid: str) -> None:
    """Delete a key: every token it signed stops working. The master key stays."""
    if target.local:
        target.keys().delete(keyid)
    else:
        target.call("DELETE", f"keys/{keyid}")
    click.echo(f"deleted {keyid}")


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
@_on_target
def token_create(target: _Target, duration: str, endpoints: str) -> None:
    """Create a user token; prints it alone on stdout."""
    if target.local:
        grants = parse_endpoints(endpoints)
        value = issue(target.keys(), target.issuer, parse_duration(duration), grants)
    else:
        body = {"duration": duration, "endpoints": endpoints}
        value = target.call("POST", "tokens", body)["token"]
    click.echo(value)


def add_commands(group: click.Group) -> None:
    """The kronk_cli hook's work: `kronk security`."""
    group.add_command(security)
