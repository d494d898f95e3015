"""A command run in a pseudo-terminal, as a person at a keyboard runs it: keys are typed,
Ctrl-C is a keystroke the terminal turns into SIGINT, and the screen is read until what is
expected shows (a condition, never a number of seconds)."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

# The escape sequences a terminal interprets (colours, cursor moves): not text on screen.
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[=>]|\r")


class Terminal:
    """`with Terminal([...]) as term: term.expect(">>> "); term.type("hi\\n")`."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float = 120.0,
    ) -> None:
        self.timeout = timeout
        self._main, secondary = pty.openpty()
        self.process = subprocess.Popen(
            list(command),
            stdin=secondary,
            stdout=secondary,
            stderr=secondary,
            env={**os.environ, **(env or {}), "TERM": "xterm"},
            cwd=cwd,
            start_new_session=True,  # its own session: the pty is its controlling terminal
            preexec_fn=_take_terminal,
        )
        os.close(secondary)
        self._seen = ""
        self._read_to = 0  # what expect() has consumed

    @property
    def screen(self) -> str:
        """Everything shown so far, escape sequences removed."""
        return _ESCAPES.sub("", self._seen)

    def type(self, keys: str) -> None:
        os.write(self._main, keys.encode())

    def interrupt(self) -> None:
        """Ctrl-C, as the keyboard sends it."""
        self.type("\x03")

    def expect(self, text: str | re.Pattern[str]) -> str:
        """Read until `text` shows after what the last expect() consumed; return what
        showed up to and including it. AssertionError with the screen if it never does."""
        deadline = time.monotonic() + self.timeout
        while True:
            rest = self.screen[self._read_to :]
            found = re.search(text if isinstance(text, re.Pattern) else re.escape(text), rest)
            if found:
                self._read_to += found.end()
                return rest[: found.end()]
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                raise AssertionError(f"{text!r} never showed; the screen:\n{self.screen}")

    def wait(self) -> int:
        """Read to the end; the exit status."""
        while self._read(self.timeout):
            pass
        return self.process.wait(timeout=self.timeout)

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self._main], [], [], timeout)
        if not ready:
            return False
        try:
            chunk = os.read(self._main, 65536)
        except OSError:  # the other side closed: the process ended
            return False
        if not chunk:
            return False
        self._seen += chunk.decode("utf-8", "replace")
        return True

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        os.close(self._main)

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _take_terminal() -> None:
    """In the child: make stdin (the pty) its controlling terminal, so Ctrl-C signals it."""
    import fcntl
    import termios

    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
