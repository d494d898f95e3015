"""A real uvicorn on 127.0.0.1 in a thread, for tests: `serving`, `free_port`, `RunningServer`."""

from __future__ import annotations

import contextlib
import itertools
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from litestar import Litestar

    from kronk_api.contract import HttpTimeouts
    from kronk_core import Kronk


@dataclass
class RunningServer:
    """A served Kronk: where it listens, the instance and the app."""

    base_url: str
    kronk: Kronk
    app: Litestar


def _ephemeral_low() -> int:
    """Where the kernel's ephemeral range starts: outgoing connections take ports above it."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


# Test ports come from below the ephemeral range, in turn from a random start (next() on a
# count is safe across threads): a port found free there stays free until the server
# started by the test binds it, seconds later.
_FIRST_PORT, _LOW = 10000, _ephemeral_low()
_next_port = itertools.count(random.randrange(_FIRST_PORT, max(_LOW, _FIRST_PORT + 1)))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (and no connection will take)."""
    span = _LOW - _FIRST_PORT
    for _ in range(1000 if span >= 1000 else 0):
        port = _FIRST_PORT + (next(_next_port) - _FIRST_PORT) % span
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:  # no room below the ephemeral range: the kernel's pick
        probe.bind(("127.0.0.1", 0))
        chosen: int = probe.getsockname()[1]
    return chosen


@contextlib.contextmanager
def serving(
    app: Litestar | HttpTimeouts, lifespan: Literal["on", "off"] = "on", **options: Any
) -> Iterator[str]:
    """Run app on a real uvicorn on 127.0.0.1 (free port) in a thread; yield its base URL.

    With lifespan "on" the server's startup and shutdown hooks run, and shutdown
    closes the app's Kronk. `options` go to uvicorn.Config (timeout_keep_alive, ...).
    """
    import uvicorn  # here: the pytest plugin imports this module in every test run

    port = free_port()
    # The listening socket's send buffer, which its connections inherit: a small one makes
    # a client that stops reading stall the server's sends within a few kilobytes.
    send_buffer = options.pop("send_buffer", None)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan=lifespan, **options
    )
    instance = uvicorn.Server(config)
    sockets = None
    if send_buffer is not None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
        listener.bind(("127.0.0.1", port))
        sockets = [listener]
    thread = threading.Thread(target=instance.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not instance.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        instance.should_exit = True
        thread.join(timeout=10)


Serve = Callable[..., contextlib.AbstractContextManager[str]]
