"""A listening socket, made before anything slow starts: a taken address fails at once."""

from __future__ import annotations

import errno
import socket

from kronk_core.contract.errors import KronkError

BACKLOG = 128


class ListenError(KronkError):
    """The address cannot be listened on: taken, not this machine's, or not allowed."""

    code = "listen_failed"

    def __init__(self, message: str, *, in_use: bool) -> None:
        super().__init__(message)
        self.in_use = in_use


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port and listening (ListenError naming the address if not).

    Listening here, not only binding, decides the race with another process that
    binds the same port at once: with SO_REUSEADDR both binds succeed, and the
    second to listen must learn it here, not inside uvicorn.
    """
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise _error(where, exc) from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise _error(where, exc) from None
    return sock


def _error(where: str, exc: OSError) -> ListenError:
    message = f"cannot listen on {where}: {exc.strerror or exc}"
    return ListenError(message, in_use=exc.errno == errno.EADDRINUSE)
