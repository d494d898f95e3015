"""The one `kronk libs` build the tests share: CPU, with the RPC backend and its worker, and
llama.cpp's llama-batched-bench beside them (`--tool`: a small target once RPC has built
llama.cpp's common library).

It goes to ~/.cache/kronk/libs, outside the checkout, and is kept: the first test that
needs it builds it (measured on 2 cores: 130 s from scratch, 104 s from a build without
RPC), every later one finds its manifest up to date. The llamacpp plugin's test_libs.py
and test_rpc.py both use it, so CI pays once.
"""

from __future__ import annotations

import os
import subprocess
import sys

from kronk_core.contract import cache_dir

LIBS = cache_dir() / "libs"
BUILD = (
    "libs", "--processor", "cpu", "--rpc", "--tool", "llama-batched-bench",
    "--lib-path", str(LIBS),
)  # fmt: skip


def kronk(
    *args: str, env: dict[str, str] | None = None, timeout: float = 1800
) -> subprocess.CompletedProcess[str]:
    """`kronk ARGS` in a child process, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "kronk_api.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def build() -> subprocess.CompletedProcess[str]:
    return kronk(*BUILD)


# Loads the build's libraries in a child process.
USE_IT = {"KRONK_PROCESSOR": "cpu", "KRONK_LIB_PATH": str(LIBS)}
