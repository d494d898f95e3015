"""llama.cpp's own llama-server, built once from the pinned llama-cpp-python sdist.

The build lives outside the repository (`$KRONK_BENCH_CACHE`, default
~/.cache/kronk-bench) and is reused by later runs. It is configured as
llama-cpp-python's own pip build is (Release, native CPU, OpenMP), so both
sides run the same llama.cpp compiled the same way.

Kronk keeps ggml off its AMX weight layout (kronk_llamacpp/amx.py: the AMX
kernels crash on hosts that advertise it). llama-server gets the same layout
from a preloaded shim that refuses the AMX permission request, which makes
ggml skip that buffer type exactly as Kronk's change does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from kronk_llamacpp.libs import unpack


def cache_dir() -> Path:
    return Path(os.environ.get("KRONK_BENCH_CACHE", Path.home() / ".cache" / "kronk-bench"))


def _sdist(pinned: str, into: Path) -> Path:
    archive = into / f"llama_cpp_python-{pinned}.tar.gz"
    if not archive.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
             "llama-cpp-python", f"llama-cpp-python=={pinned}", "-d", str(into)],
            check=True,
        )
    return archive


_NO_AMX_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>

long syscall(long number, ...) {
    static long (*real)(long, ...) = 0;
    va_list args;
    va_start(args, number);
    long a = va_arg(args, long), b = va_arg(args, long), c = va_arg(args, long);
    long d = va_arg(args, long), e = va_arg(args, long), f = va_arg(args, long);
    va_end(args);
    if (number == SYS_arch_prctl && a == 0x1023 /* ARCH_REQ_XCOMP_PERM */) {
        errno = EPERM;
        return -1;
    }
    if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    return real(number, a, b, c, d, e, f);
}
"""


def no_amx_environment() -> dict[str, str]:
    """Environment for llama-server: the shim preloaded (built once)."""
    shim = cache_dir() / "no-amx.so"
    if not shim.exists():
        source = shim.with_suffix(".c")
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(_NO_AMX_SHIM)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(shim), str(source)], check=True)
    return {**os.environ, "LD_PRELOAD": str(shim)}


def llama_server_binary() -> Path:
    """The llama-server of the installed llama-cpp-python's version, built if missing."""
    return llama_tool("llama-server")


def llama_tool(target: str) -> Path:
    """One of llama.cpp's programs (llama-server, llama-batched-bench) of the installed
    llama-cpp-python's version, built if missing in the one build tree they share."""
    pinned = version("llama-cpp-python")
    root = cache_dir()
    build = root / f"llama-server-{pinned}"
    binary = build / "bin" / target
    if binary.exists():
        return binary
    if shutil.which("cmake") is None:
        raise SystemExit("building llama-server needs cmake and a C++ compiler on PATH")
    root.mkdir(parents=True, exist_ok=True)
    source = root / f"llama_cpp_python-{pinned}"
    if not source.exists():
        unpack(_sdist(pinned, root), root)
    llama_cpp_source = source / "vendor" / "llama.cpp"
    print(f"building {target} {pinned} into {build} (once; a few minutes)", flush=True)
    subprocess.run(
        ["cmake", "-S", str(llama_cpp_source), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
         "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
         "-DLLAMA_BUILD_EXAMPLES=OFF"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run(
        ["cmake", "--build", str(build), "--target", target, "-j", str(os.cpu_count() or 1)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return binary
