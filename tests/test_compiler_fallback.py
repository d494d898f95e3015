"""The nox sessions' compiler fallback (noxfile.py): where a machine has no C/C++ compiler,
llama.cpp is compiled with the clang of PyPI's `ziglang` wheel, through scripts named as
CMake expects. Here the detection, and the scripts doing a build's real work with the real
zig (the `test` extra pins the noxfile's version); `nox -s zig` runs the full build."""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import ziglang

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the fallback is Linux's (noxfile.py)"
)

ROOT = Path(__file__).resolve().parents[1]
ZIG = Path(ziglang.__file__).parent / "zig"


def _noxfile() -> ModuleType:
    spec = importlib.util.spec_from_file_location("noxfile", ROOT / "noxfile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


noxfile = _noxfile()


def test_the_test_extra_pins_the_zig_the_sessions_install() -> None:
    installed = importlib.metadata.version("ziglang")
    assert noxfile.ZIGLANG.removeprefix("ziglang==") == installed


def test_compilers_are_looked_for_where_cmake_looks(tmp_path: Path) -> None:
    tools = tmp_path / "zig"
    noxfile.zig_environment(ZIG, tools, {})
    empty = tmp_path / "empty"
    empty.mkdir()
    assert not noxfile.has_compilers({"PATH": str(empty)})
    # Debian's gcc without g++: C alone cannot build llama.cpp.
    system = tmp_path / "bin"
    system.mkdir()
    (system / "gcc").symlink_to(tools / "cc")
    assert not noxfile.has_compilers({"PATH": str(system)})
    (system / "g++").symlink_to(tools / "c++")
    assert noxfile.has_compilers({"PATH": f"{empty}:{system}"})
    named = {"PATH": str(empty), "CC": str(tools / "cc"), "CXX": str(tools / "c++")}
    assert noxfile.has_compilers(named)
    # Once first on PATH, zig's scripts are the compilers that `kronk libs` finds too.
    assert noxfile.has_compilers({"PATH": str(tools)})


def test_the_environment_puts_zig_first_and_keeps_the_caller_s_cmake_args(
    tmp_path: Path,
) -> None:
    tools = tmp_path / "zig"
    added = noxfile.zig_environment(ZIG, tools, {"PATH": "/usr/bin", "CMAKE_ARGS": "-DX=1"})
    assert added["PATH"] == f"{tools}:/usr/bin"
    # scikit-build-core, left alone, sets CC and CXX to what Python was built with.
    assert (added["CC"], added["CXX"]) == (str(tools / "cc"), str(tools / "c++"))
    # zig ships no OpenMP runtime; the caller's arguments come last, so theirs win.
    assert shlex.split(added["CMAKE_ARGS"]) == ["-DGGML_OPENMP=OFF", "-DX=1"]
    version = subprocess.run(
        [tools / "c++", "--version"], capture_output=True, text=True, check=True
    )
    assert "clang version" in version.stdout


C_PART = """
int twice(int value) { return 2 * value; }
"""
# Strings, vectors and an exception thrown and caught inside the library, as llama.cpp's
# model loader does: the C++ runtime zig links in must work inside CPython.
CXX_PART = """
#include <stdexcept>
#include <string>
#include <vector>
extern "C" int twice(int value);
extern "C" int parts(const char * text) {
    try {
        std::vector<std::string> found;
        std::string current;
        for (const char * c = text; *c; ++c) {
            if (*c == ',') { found.push_back(current); current.clear(); }
            else current += *c;
        }
        found.push_back(current);
        if (found.size() > 3) throw std::runtime_error("too many: " + std::to_string(found.size()));
        return twice((int) found.size());
    } catch (const std::exception & error) {
        return -(int) std::string(error.what()).size();
    }
}
"""


def test_zig_s_scripts_build_a_cxx_library_that_python_loads(tmp_path: Path) -> None:
    """Compile C and C++, archive and index them (CMake's `ar qc` and `ranlib` for a static
    library such as llama.cpp's `common`), link a shared library, call it from Python."""
    tools = tmp_path / "zig"
    noxfile.zig_environment(ZIG, tools, {})
    (tmp_path / "part.c").write_text(C_PART)
    (tmp_path / "parts.cpp").write_text(CXX_PART)

    def run(tool: str, *args: str) -> None:
        alone = {**os.environ, "PATH": str(tools)}  # no system compiler, linker or archiver
        subprocess.run([tools / tool, *args], cwd=tmp_path, check=True, env=alone)

    run("cc", "-O2", "-fPIC", "-march=native", "-c", "part.c", "-o", "part.o")
    run("c++", "-O2", "-fPIC", "-march=native", "-std=c++17", "-c", "parts.cpp", "-o", "parts.o")
    run("ar", "qc", "libparts.a", "part.o", "parts.o")
    run("ranlib", "libparts.a")
    run("c++", "-shared", "-o", "libparts.so",
        "-Wl,--whole-archive", "libparts.a", "-Wl,--no-whole-archive")  # fmt: skip
    # Kronk loads the system's C++ runtime first, into the global scope (kronk_llamacpp.native).
    ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
    library = ctypes.CDLL(str(tmp_path / "libparts.so"))
    assert library.parts(b"a,b,c") == 6
    assert library.parts(b"a,b,c,d") == -len("too many: 4")


# What llama.cpp's CPU backend is built for with GGML_NATIVE (`-march=native`): the CPU's
# features, as /proc/cpuinfo names them, and the macros that switch ggml's kernels on.
FEATURES = {
    "x86_64": {"avx": "__AVX__", "avx2": "__AVX2__", "fma": "__FMA__", "f16c": "__F16C__",
               "avx512f": "__AVX512F__", "avx_vnni": "__AVXVNNI__"},
    "aarch64": {"asimddp": "__ARM_FEATURE_DOTPROD", "i8mm": "__ARM_FEATURE_MATMUL_INT8",
                "sve": "__ARM_FEATURE_SVE"},
}  # fmt: skip


def test_zig_tunes_for_this_cpu_as_gcc_s_native_build_does(tmp_path: Path) -> None:
    machine = platform.machine()
    if machine not in FEATURES:
        pytest.skip(f"no feature table for {machine}")
    tools = tmp_path / "zig"
    noxfile.zig_environment(ZIG, tools, {})
    macros = subprocess.run(
        [tools / "cc", "-march=native", "-dM", "-E", "-x", "c", "/dev/null"],
        capture_output=True, text=True, check=True,
    ).stdout.split("\n")  # fmt: skip
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    flags = next(line for line in cpuinfo if line.startswith(("flags", "Features")))
    has = set(flags.split(":", 1)[1].split())
    for feature, macro in FEATURES[machine].items():
        assert (feature in has) == any(line.startswith(f"#define {macro} ") for line in macros), (
            feature
        )
