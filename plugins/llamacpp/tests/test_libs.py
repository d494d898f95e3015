"""`kronk libs`: a real CPU build from the pinned llama-cpp-python sdist, installed and used.

The build (about 4 minutes on 2 cores) goes to ~/.cache/kronk/libs, outside the checkout,
and is kept: a later run finds its manifest up to date and does not rebuild.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from kronk_core.models import cache_dir
from kronk_llamacpp.native import MANIFEST

LIBS = cache_dir() / "libs"

USE_THEM = """
import asyncio
from pathlib import Path
from kronk_core import Kronk
kronk = Kronk()
result = asyncio.run(kronk.chat([{"role": "user", "content": "Hi"}], max_tokens=4))
from kronk_llamacpp import native
print("tokens", result.usage.completion_tokens)
print("directory", native.load().directory)
maps = Path("/proc/self/maps").read_text().splitlines()
print("mapped", ",".join(sorted({line.split()[-1] for line in maps if "libllama" in line})))
kronk.close()
"""


def kronk(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kronk_api.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=1800,
    )


def test_a_missing_toolchain_is_a_clear_error_before_any_download(tmp_path: Path) -> None:
    bare = {"PATH": str(tmp_path), "VULKAN_SDK": str(tmp_path)}
    vulkan = kronk("libs", "--processor", "vulkan", "--lib-path", str(tmp_path), env=bare)
    assert vulkan.returncode == 1
    assert "cannot build the vulkan libraries; missing:" in vulkan.stderr
    assert "glslc" in vulkan.stderr and "cmake" in vulkan.stderr
    metal = kronk("libs", "--processor", "metal", "--lib-path", str(tmp_path))
    assert metal.returncode == 1 and "Metal libraries build only on a Mac" in metal.stderr
    assert not (tmp_path / "src").exists()


def test_cpu_libraries_build_install_and_serve() -> None:
    built = kronk("libs", "--processor", "cpu", "--lib-path", str(LIBS))
    assert built.returncode == 0, built.stdout + built.stderr
    assert f"KRONK_LIB_PATH={LIBS} KRONK_PROCESSOR=cpu kronk server start" in built.stdout
    manifest = json.loads((LIBS / "cpu" / MANIFEST).read_text())
    assert manifest["processor"] == "cpu"
    assert manifest["llama_cpp_python"] == version("llama-cpp-python")
    assert "-DBUILD_SHARED_LIBS=ON" in manifest["cmake_args"]

    again = kronk("libs", "--processor", "cpu", "--lib-path", str(LIBS))
    assert again.returncode == 0 and "up to date" in again.stdout

    chosen = {"KRONK_PROCESSOR": "cpu", "KRONK_LIB_PATH": str(LIBS)}
    used = subprocess.run(
        [sys.executable, "-c", USE_THEM],
        capture_output=True,
        text=True,
        env={**os.environ, **chosen},
        timeout=600,
    )
    assert used.returncode == 0, used.stderr
    lines = dict(line.split(" ", 1) for line in used.stdout.splitlines())
    assert int(lines["tokens"]) > 0
    assert Path(lines["directory"]) == LIBS / "cpu"
    mapped = lines["mapped"].split(",")
    assert mapped and all(path.startswith(f"{LIBS / 'cpu'}/") for path in mapped)


def test_a_processor_without_libraries_is_refused_with_the_command_to_run(tmp_path: Path) -> None:
    refused = subprocess.run(
        [sys.executable, "-c", USE_THEM],
        capture_output=True,
        text=True,
        env={**os.environ, "KRONK_PROCESSOR": "cuda", "KRONK_LIB_PATH": str(tmp_path)},
        timeout=600,
    )
    assert refused.returncode != 0
    assert f"no cuda llama.cpp libraries in {tmp_path / 'cuda'}" in refused.stderr
    assert "kronk libs --processor cuda" in refused.stderr
