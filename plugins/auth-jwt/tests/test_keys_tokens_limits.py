"""The auth-jwt plugin without a server: key files, token claims, grants, windows, SQLite."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jwt
import pytest

from kronk_auth_jwt.keys import MASTER, KeyStore, UnknownKeyError
from kronk_auth_jwt.sqlite_store import SqliteLimitStore
from kronk_auth_jwt.tokens import (
    Grant,
    issue,
    open_key_store,
    parse_duration,
    parse_endpoints,
    verify,
)
from kronk_auth_jwt.windows import window_bounds
from kronk_core.contract.errors import AuthenticationError, InvalidRequestError


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    """Modes must not depend on the umask of whoever starts the server."""
    previous = os.umask(0)
    yield
    os.umask(previous)


def test_first_use_creates_private_keys_and_an_admin_token(
    tmp_path: Path, permissive_umask: None
) -> None:
    keys = open_key_store(tmp_path / "keys", "kronk")
    directory = tmp_path / "keys"
    assert directory.stat().st_mode & 0o777 == 0o700
    names = sorted(path.name for path in directory.iterdir())
    assert names[-2:] == ["master.jwt", "master.pem"] and len(names) == 3
    for path in directory.iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path

    admin = keys.admin_token_path.read_text()
    header = jwt.get_unverified_header(admin)
    assert header == {"alg": "RS256", "kid": MASTER, "typ": "JWT"}
    claims = verify(admin, keys, "kronk")
    assert claims.admin
    payload = jwt.decode(admin, options={"verify_signature": False})
    lifetime = timedelta(seconds=payload["exp"] - payload["iat"])
    assert timedelta(days=3650) <= lifetime <= timedelta(days=3660)

    again = open_key_store(directory, "kronk")  # a restart keeps everything
    assert sorted(path.name for path in directory.iterdir()) == names
    assert again.admin_token_path.read_text() == admin


def test_keys_list_create_delete(tmp_path: Path) -> None:
    keys = open_key_store(tmp_path / "keys", "kronk")
    first = keys.signing_key_id()
    created = keys.create()
    assert keys.signing_key_id() == created.id != first
    assert [info.id for info in keys.list()] == [MASTER, first, created.id]
    with pytest.raises(InvalidRequestError, match="master key cannot be deleted"):
        keys.delete(MASTER)
    with pytest.raises(UnknownKeyError):
        keys.delete("../keys/master")
    with pytest.raises(UnknownKeyError):
        keys.delete("no-such-key")
    token = issue(keys, "kronk", timedelta(hours=1), {"tokenize": Grant()})
    assert verify(token, keys, "kronk").endpoints == {"tokenize": Grant()}
    keys.delete(created.id)
    assert keys.signing_key_id() == first
    with pytest.raises(AuthenticationError, match="unknown or deleted key"):
        verify(token, keys, "kronk")


def test_another_process_deleting_a_key_is_seen(tmp_path: Path) -> None:
    """Seen even when the directory's modification time does not change (coarse timestamps)."""
    directory = tmp_path / "keys"
    server = open_key_store(directory, "kronk")
    token = issue(server, "kronk", timedelta(hours=1), {"tokenize": Grant()})
    assert verify(token, server, "kronk").subject
    before = directory.stat()
    deleting = f"""
from pathlib import Path
from kronk_auth_jwt.keys import KeyStore
KeyStore(Path({str(directory)!r})).delete({server.signing_key_id()!r})
"""
    subprocess.run([sys.executable, "-c", deleting], check=True, timeout=60)
    os.utime(directory, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(AuthenticationError, match="unknown or deleted key"):
        verify(token, server, "kronk")


def test_a_key_file_replaced_is_read_again(tmp_path: Path) -> None:
    """A key id whose file was replaced by another key verifies with the new key only."""
    directory = tmp_path / "keys"
    keys = open_key_store(directory, "kronk")
    key_id = keys.signing_key_id()
    old = issue(keys, "kronk", timedelta(hours=1), {"tokenize": Grant()})
    assert verify(old, keys, "kronk").subject
    other = KeyStore(tmp_path / "other")
    other.ensure()
    os.replace(tmp_path / "other" / "master.pem", directory / f"{key_id}.pem")
    with pytest.raises(AuthenticationError, match="signature does not verify"):
        verify(old, keys, "kronk")
    new = issue(keys, "kronk", timedelta(hours=1), {"tokenize": Grant()}, key_id=key_id)
    assert verify(new, keys, "kronk").subject


def test_grant_specs_follow_the_manual() -> None:
    assert parse_endpoints("chat-completions:1000/day,embeddings:500/day") == {
        "chat-completions": Grant(1000, "day"),
        "embeddings": Grant(500, "day"),
    }
    assert parse_endpoints("chat-completions:100/day,embeddings:unlimited,rerank") == {
        "chat-completions": Grant(100, "day"),
        "embeddings": Grant(),
        "rerank": Grant(),
    }
    assert parse_endpoints("messages:10000/month, responses:5/year") == {
        "messages": Grant(10000, "month"),
        "responses": Grant(5, "year"),
    }
    for bad in ("", "chat:0/day", "chat:10/week", "chat:ten/day", "Chat", "chat:10"):
        with pytest.raises(InvalidRequestError, match="endpoints"):
            parse_endpoints(bad)


def test_durations_are_go_style() -> None:
    assert parse_duration("720h") == timedelta(days=30)
    assert parse_duration("1h30m") == timedelta(minutes=90)
    assert parse_duration("90s") == timedelta(seconds=90)
    for bad in ("", "10d", "h", "0h", "1h 30m", "-1h"):
        with pytest.raises(InvalidRequestError, match="duration"):
            parse_duration(bad)


@pytest.mark.parametrize(
    ("window", "now", "start", "end"),
    [
        ("day", datetime(2024, 12, 31, 23, 59, tzinfo=UTC), "2024-12-31", "2025-01-01"),
        ("month", datetime(2024, 2, 29, 12, tzinfo=UTC), "2024-02-01", "2024-03-01"),
        ("month", datetime(2024, 12, 15, tzinfo=UTC), "2024-12-01", "2025-01-01"),
        ("year", datetime(2024, 6, 1, tzinfo=UTC), "2024-01-01", "2025-01-01"),
        # 01:30 in UTC+2 is still the previous UTC day.
        (
            "day",
            datetime(2024, 3, 2, 1, 30, tzinfo=UTC) + timedelta(hours=-2),
            "2024-03-01",
            "2024-03-02",
        ),
    ],
)
def test_windows_start_at_utc_boundaries(window: str, now: datetime, start: str, end: str) -> None:
    begins, ends = window_bounds(window, now)  # type: ignore[arg-type]
    assert (begins.isoformat(), ends.isoformat()) == (
        f"{start}T00:00:00+00:00",
        f"{end}T00:00:00+00:00",
    )


def test_sqlite_store_is_atomic_and_shared_between_connections(tmp_path: Path) -> None:
    path = tmp_path / "limits.db"
    first, second = SqliteLimitStore(path), SqliteLimitStore(path)  # as two servers would
    expires_at = time.time() + 60

    async def race() -> list[bool]:
        return await asyncio.gather(
            *(store.acquire("k", 10, expires_at) for store in [first, second] * 50)
        )

    try:
        assert asyncio.run(race()).count(True) == 10
        assert not asyncio.run(first.acquire("other", 0, expires_at))
        assert asyncio.run(first.acquire("old", 1, time.time() - 1))
    finally:
        first.close()
        second.close()
    reopened = SqliteLimitStore(path)  # a restart forgets expired windows only
    try:
        assert not asyncio.run(reopened.acquire("k", 10, expires_at))
        assert asyncio.run(reopened.acquire("old", 1, time.time() + 60))
    finally:
        reopened.close()
