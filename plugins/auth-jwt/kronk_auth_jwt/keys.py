"""The signing keys on disk: `<base>/keys/` holds `<key id>.pem` RSA keys and `master.jwt`."""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from kronk_core.contract import InvalidRequestError, KronkError

MASTER = "master"
ADMIN_TOKEN_FILE = "master.jwt"
ADMIN_TOKEN_LIFETIME = timedelta(days=3653)  # ten years
_KEY_ID = re.compile(r"[A-Za-z0-9-]{1,64}")


class UnknownKeyError(KronkError):
    status = 404
    code = "key_not_found"


@dataclass(frozen=True)
class KeyInfo:
    id: str
    created: datetime

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "created": self.created.isoformat().replace("+00:00", "Z")}


def _write_private(path: Path, data: bytes, *, replace: bool = False) -> None:
    """Write path readable by its owner only, whole or not at all.

    Without `replace`, an existing file stays (another server starting on the
    same directory may have won the race) and FileExistsError is raised.
    """
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
    try:
        if replace:
            os.replace(temporary, path)
        else:
            os.link(temporary, path)  # atomic, and fails if path exists
    finally:
        temporary.unlink(missing_ok=True)


_FileIdentity = tuple[int, int, int, int]


def _identity(status: os.stat_result) -> _FileIdentity:
    """What tells one key file from another written in its place."""
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)


class KeyStore:
    """The key directory, plus the public keys loaded from it.

    Each verification looks the key's file up (one `stat`), so a key deleted by
    `kronk security ... --local` or another server stops verifying at once,
    whatever the file system's timestamp resolution. The public key is parsed
    again only when the file is a different one.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        # key id -> (the file's identity when it was read, its public key)
        self._public: dict[str, tuple[_FileIdentity, rsa.RSAPublicKey]] = {}

    @property
    def admin_token_path(self) -> Path:
        return self.directory / ADMIN_TOKEN_FILE

    def write_admin_token(self, token: str) -> None:
        _write_private(self.admin_token_path, token.encode(), replace=True)

    def ensure(self) -> bool:
        """Create the directory (0700), master key and one signing key if missing.

        Returns True if the master key was created: its admin token is then due.
        """
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)  # mkdir's mode is masked by the umask
        created = False
        try:
            self._write_key(MASTER)
            created = True
        except FileExistsError:
            pass
        if created or not self._signing_ids():
            self.create()
        return created

    def _write_key(self, key_id: str) -> None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        _write_private(self._path(key_id), pem)

    def _path(self, key_id: str) -> Path:
        if not _KEY_ID.fullmatch(key_id):
            raise UnknownKeyError(f"no key {key_id!r}", param="key_id")
        return self.directory / f"{key_id}.pem"

    def _signing_ids(self) -> list[str]:
        """Non-master key ids, oldest first."""
        keys = [key for key in self.list() if key.id != MASTER]
        return [key.id for key in keys]

    def list(self) -> list[KeyInfo]:
        """Every key, the master first, then by creation time."""
        infos = [
            KeyInfo(path.stem, datetime.fromtimestamp(path.stat().st_mtime, UTC))
            for path in self.directory.glob("*.pem")
        ]
        return sorted(infos, key=lambda info: (info.id != MASTER, info.created, info.id))

    def create(self) -> KeyInfo:
        key_id = str(uuid.uuid4())
        self._write_key(key_id)
        return KeyInfo(key_id, datetime.fromtimestamp(self._path(key_id).stat().st_mtime, UTC))

    def delete(self, key_id: str) -> None:
        """Delete a key; every token it signed stops verifying at once."""
        if key_id == MASTER:
            raise InvalidRequestError("the master key cannot be deleted", param="key_id")
        try:
            self._path(key_id).unlink()
        except FileNotFoundError:
            raise UnknownKeyError(f"no key {key_id!r}", param="key_id") from None
        self._public.pop(key_id, None)

    def private_key(self, key_id: str) -> rsa.RSAPrivateKey:
        try:
            pem = self._path(key_id).read_bytes()
        except FileNotFoundError:
            raise UnknownKeyError(f"no key {key_id!r}", param="key_id") from None
        key = serialization.load_pem_private_key(pem, password=None)
        if not isinstance(key, rsa.RSAPrivateKey):
            raise UnknownKeyError(f"key {key_id!r} is not an RSA key", param="key_id")
        return key

    def signing_key_id(self) -> str:
        """The newest non-master key signs user tokens, so a new key starts a rotation."""
        ids = self._signing_ids()
        return ids[-1] if ids else MASTER

    def public_key(self, key_id: str) -> rsa.RSAPublicKey | None:
        """The public half of a key whose file exists now, or None."""
        if not _KEY_ID.fullmatch(key_id):
            return None
        path = self._path(key_id)
        try:
            identity = _identity(path.stat())
        except FileNotFoundError:
            self._public.pop(key_id, None)
            return None
        cached = self._public.get(key_id)
        if cached is not None and cached[0] == identity:
            return cached[1]
        try:
            public = self.private_key(key_id).public_key()
        except (UnknownKeyError, ValueError, OSError):
            return None  # deleted meanwhile, unreadable or not a key: it verifies nothing
        self._public[key_id] = (identity, public)
        return public
