"""Models spread over llama.cpp RPC workers (`rpc_servers`), the way llama-server's --rpc does.

A worker (`ggml-rpc-server`, `kronk rpc start`) exposes its devices over TCP. The client
side is ggml's RPC backend in the libraries `kronk libs --rpc` builds: each server is
added through the backend's registry (`ggml_backend_rpc_add_server`, as llama.cpp's
common/arg.cpp `add_rpc_devices` does) and registered, and a model that names it gets its
devices in `llama_model_params.devices`, before this machine's GPUs.

ggml's RPC client aborts the process when a worker cannot be reached or its connection
breaks (`GGML_ABORT`, in its own dispatcher thread). Kronk keeps that from being a silent
crash or a hang:

- before a load, each server is asked for the protocol's handshake from Python, with a
  timeout: one that is down, busy with another client (a worker serves one at a time) or of
  another protocol version is a ModelLoadError naming it;
- the connections llama.cpp opened get TCP keepalives and a user timeout, so a worker host
  that vanishes without closing them fails them in bounded time instead of never;
- before each decode the model peeks at its connections: a worker that closed its own
  (stopped, killed, restarted) stops the model's engine with BackendLostError, the requests
  get a 503 naming the worker, readiness answers 503, and the process stays up for others;
- when llama.cpp aborts all the same (the worker died during a decode), an abort callback
  logs what happened and which workers the models use before the process ends.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import socket
import struct
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp

from kronk_core.contract import BackendLostError, BackendUnavailableError, ModelLoadError
from kronk_llamacpp import native
from kronk_llamacpp.endpoint import Endpoint

log = logging.getLogger(__name__)

# The handshake: RPC_CMD_HELLO (14, fixed across protocol versions), an 8-byte size, then
# rpc_msg_hello_req (24 bytes of transport capabilities: zeros, plain TCP). The answer is
# an 8-byte size and rpc_msg_hello_rsp: major, minor, patch, padding, 24 capability bytes.
_HELLO = 14
_CAPS = 24
_HELLO_ANSWER = 4 + _CAPS
# How long a worker may take to answer the handshake before the load gives up on it.
HANDSHAKE_SECONDS = 5.0
# A connection whose host stopped answering is failed after about idle + interval x count
# seconds of silence (keepalives), or when sent data stays unacknowledged this long.
KEEPALIVE_IDLE = 10
KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 3
USER_TIMEOUT_MS = 30_000

_lock = threading.Lock()
# Endpoint → its device handles, for the servers this process added (ggml keeps them for
# the life of the process too).
_added: dict[str, list[int]] = {}
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _ggml(name: str, restype: object, *argtypes: object) -> Any:
    function = getattr(llama_cpp.llama_cpp._lib, name)  # ggml through libllama's handle
    function.restype = restype
    function.argtypes = list(argtypes)
    return function


def rpc_registry() -> int | None:
    """ggml's RPC backend registry, if these libraries were built with it."""
    by_name = _ggml("ggml_backend_reg_by_name", ctypes.c_void_p, ctypes.c_char_p)
    return by_name(b"RPC") or None


def handshake(endpoint: Endpoint, timeout: float = HANDSHAKE_SECONDS) -> str:
    """The worker's protocol version (major.minor.patch), or BackendUnavailableError saying
    why not."""
    where = f"RPC worker {endpoint}"
    try:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
    except OSError as exc:
        raise BackendUnavailableError(
            f"{where} cannot be reached: {exc.strerror or exc} (is `kronk rpc start` running "
            "there, and is the address right?)"
        ) from None
    with sock:
        try:
            sock.sendall(struct.pack("<BQ", _HELLO, _CAPS) + bytes(_CAPS))
            (size,) = struct.unpack("<Q", _receive(sock, 8))
            if size != _HELLO_ANSWER:
                raise ModelLoadError(
                    f"{where} answered the handshake of another RPC protocol ({size} bytes): "
                    "run the worker from the same `kronk libs --rpc` build"
                )
            answer = _receive(sock, size)
        except TimeoutError:
            raise BackendUnavailableError(
                f"{where} accepted the connection but did not answer within {timeout:g} s: a "
                "worker serves one client at a time; is another Kronk or llama-server using it?"
            ) from None
        except OSError as exc:
            raise BackendUnavailableError(
                f"{where} closed the connection during the handshake: {exc.strerror or exc}"
            ) from None
    major, minor, patch = answer[:3]
    return f"{major}.{minor}.{patch}"


def _receive(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionResetError(errno.ECONNRESET, "the worker closed the connection")
        data += chunk
    return data


def check_protocol(endpoint: Endpoint, found: str, expected: str | None) -> None:
    """Workers of another major version, or a newer minor one, are refused by ggml's client
    with an abort: refuse them here first."""
    if expected is None:
        return
    major, minor, _ = (int(part) for part in expected.split("."))
    their_major, their_minor, _ = (int(part) for part in found.split("."))
    if their_major != major or their_minor > minor:
        raise ModelLoadError(
            f"RPC worker {endpoint} speaks protocol {found}, these libraries {expected}: "
            "run the worker from the same `kronk libs --rpc` build (same llama-cpp-python)"
        )


def loaded_protocol() -> str | None:
    """The RPC protocol of the loaded libraries, as `kronk libs --rpc` recorded it."""
    try:
        manifest = json.loads((native.load().directory / native.MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    protocol = manifest.get("rpc_protocol") if isinstance(manifest, dict) else None
    return protocol if isinstance(protocol, str) else None


def add_servers(servers: Sequence[str]) -> list[int]:
    """The device handles of `servers`, in order, each added and registered once per process."""
    registry = rpc_registry()
    if registry is None:
        raise ModelLoadError(
            "rpc_servers: these llama.cpp libraries have no RPC backend: build them with "
            "`kronk libs --rpc` (and load them: KRONK_PROCESSOR)"
        )
    endpoints = [Endpoint.parse(server) for server in servers]
    proc_address = _ggml(
        "ggml_backend_reg_get_proc_address", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p
    )
    address = proc_address(registry, b"ggml_backend_rpc_add_server")
    if not address:
        raise ModelLoadError("rpc_servers: this RPC backend has no ggml_backend_rpc_add_server")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(address)
    register = _ggml("ggml_backend_register", None, ctypes.c_void_p)
    dev_count = _ggml("ggml_backend_reg_dev_count", ctypes.c_size_t, ctypes.c_void_p)
    dev_get = _ggml("ggml_backend_reg_dev_get", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    devices: list[int] = []
    with _lock:
        for endpoint in endpoints:
            key = str(endpoint)
            if key not in _added:
                # A worker this process is connected to already serves it, and answers
                # nobody else: only new ones are asked.
                check_protocol(endpoint, handshake(endpoint), loaded_protocol())
                reg = add_server(key.encode())
                if not reg:
                    raise ModelLoadError(f"RPC worker {endpoint} has no devices")
                register(reg)
                _added[key] = [dev_get(reg, index) for index in range(dev_count(reg))]
                _install_abort_callback()
            devices += _added[key]
    return devices


def connected() -> bool:
    """Whether this process added any RPC server (their devices are then in every listing)."""
    return bool(_added)


# ---- the connections llama.cpp holds ---------------------------------------------------


def _inode(fd: int) -> str | None:
    try:
        link = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return link if link.startswith("socket:[") else None


def _tcp_peers() -> dict[str, tuple[str, int]]:
    """socket:[inode] → the remote address of every TCP connection in this network namespace."""
    peers: dict[str, tuple[str, int]] = {}
    for table, width in (("/proc/self/net/tcp", 4), ("/proc/self/net/tcp6", 16)):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            address, port = fields[2].split(":")
            raw = bytes.fromhex(address)
            # The kernel prints each 32-bit word of the address in host (little-endian) order.
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))
            if width == 16 and words[:12] == bytes(10) + b"\xff\xff":
                words = words[12:]  # an IPv4 peer of an IPv6 socket
            family = socket.AF_INET if len(words) == 4 else socket.AF_INET6
            peers[f"socket:[{fields[9]}]"] = (socket.inet_ntop(family, words), int(port, 16))
    return peers


def _addresses(endpoint: Endpoint) -> set[tuple[str, int]]:
    try:
        found = socket.getaddrinfo(
            endpoint.host, endpoint.port, socket.AF_INET, socket.SOCK_STREAM
        )  # ggml's client connects over IPv4
    except OSError:
        return set()
    return {(str(info[4][0]), endpoint.port) for info in found}


def _setsockopt(fd: int, level: int, option: int, value: int) -> None:
    assert _libc is not None
    number = ctypes.c_int(value)
    _libc.setsockopt(fd, level, option, ctypes.byref(number), ctypes.sizeof(number))


class RpcLinks:
    """The connections one model's workers are reached by (Linux: found by their peers in
    /proc; elsewhere none, and only the abort callback speaks for them)."""

    def __init__(self, servers: Sequence[str]) -> None:
        self.endpoints = [Endpoint.parse(server) for server in servers]
        self.lost: str | None = None
        self._links: list[tuple[Endpoint, int, str]] = []
        if _libc is None:
            return
        peers = _tcp_peers()
        wanted = {address: e for e in self.endpoints for address in _addresses(e)}
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            inode = _inode(fd)
            endpoint = wanted.get(peers.get(inode, ("", 0))) if inode else None
            if endpoint is None or inode is None:
                continue
            self._links.append((endpoint, fd, inode))
            _setsockopt(fd, socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            _setsockopt(fd, socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE)
            _setsockopt(fd, socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL)
            _setsockopt(fd, socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_COUNT)
            _setsockopt(fd, socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS)

    @property
    def sockets(self) -> list[int]:
        """The file descriptors of the connections (for the tests)."""
        return [fd for _, fd, _ in self._links]

    def check(self, model_id: str) -> None:
        """BackendLostError if a worker closed its connection (it stopped or restarted):
        ggml's client would abort the process at its next message."""
        if self.lost is None:
            for endpoint, fd, inode in self._links:
                if _inode(fd) == inode and not self._open(fd):
                    self.lost = str(endpoint)
                    break
        if self.lost is not None:
            raise BackendLostError(
                f"the llama.cpp RPC worker {self.lost} of {model_id} closed its connection "
                f"(stopped or restarted): {model_id} cannot run again until Kronk restarts "
                "with the worker running"
            )

    @staticmethod
    def _open(fd: int) -> bool:
        assert _libc is not None
        byte = ctypes.create_string_buffer(1)
        got = _libc.recv(fd, byte, 1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        if got > 0:
            return True
        if got == 0:
            return False  # the worker's end is closed
        return ctypes.get_errno() in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR)


# ---- when llama.cpp aborts ---------------------------------------------------------------

_AbortCallback = ctypes.CFUNCTYPE(None, ctypes.c_char_p)


def _on_abort(message: bytes | None) -> None:
    text = (message or b"").decode("utf-8", errors="replace").strip()
    log.critical(
        "llama.cpp is ending this process: %s. Models here use the RPC workers %s: one of them "
        "stopped or its network failed during a request. Start Kronk again once they run "
        "(its supervisor, e.g. systemd's Restart=, does)",
        text,
        ", ".join(_added),
    )
    for handler in logging.getLogger().handlers:
        handler.flush()
    print(f"kronk: llama.cpp aborted: {text}", file=sys.stderr, flush=True)


_abort_callback = _AbortCallback(_on_abort)  # kept alive: ggml holds the pointer


def _install_abort_callback() -> None:
    """Once, when the first RPC server is added: other aborts keep ggml's own report (with
    its backtrace) in processes that use no workers."""
    setter = _ggml("ggml_set_abort_callback", ctypes.c_void_p, _AbortCallback)
    setter(_abort_callback)
