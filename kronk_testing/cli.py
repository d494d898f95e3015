"""`kronk` in a child process, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "kronk_api.cli"]


def kronk_at(base: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`kronk ARGS --base-path BASE`, its output captured, without this process's KRONK_*
    variables (a developer's own settings must not leak into a test)."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("KRONK_")}
    return subprocess.run(
        [*CLI, *args, "--base-path", str(base)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
