"""The load-order crash's mechanism, shown with the real loader: who binds the C++ runtime.

A shared library's references are resolved in the scope of whatever loaded it first
(and Python loads extensions with RTLD_NOW, so all of them at once). numpy's core
extension carries copies of a few libstdc++ symbols; when it loads libstdc++ first,
libstdc++'s own references bind to those copies for the rest of the process. Kronk loads
the C++ runtime on its own, first, into the global scope (kronk_llamacpp.native), so that
in a Kronk process it binds only to itself. Linux/glibc only: LD_DEBUG is glibc's.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
from ld_bindings import run

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc's dynamic loader only"
)

NUMPY_FIRST = """
import os; print(f"pid={os.getpid()}", flush=True)
import numpy._core._multiarray_umath
import llama_cpp
"""

KRONK = """
import os; print(f"pid={os.getpid()}", flush=True)
from kronk_core import Kronk
kronk = Kronk()
from kronk_llamacpp.library import ensure_initialised
ensure_initialised()
import numpy._core._multiarray_umath  # loaded by now (caching, llama_cpp): a no-op
"""


def test_numpy_first_captures_the_cxx_runtime() -> None:
    """Without Kronk's order: libstdc++, loaded by numpy, binds some references to numpy."""
    report = run(NUMPY_FIRST)
    assert report.returncode == 0, report.output
    assert report.loaded_by["libstdc++.so.6"].startswith("needed by _multiarray_umath")
    captured = report.captured()
    assert captured, "numpy no longer captures libstdc++: the mechanism changed, re-check"
    assert all(target.startswith("_multiarray_umath") for _, target in captured)


def test_kronk_loads_the_cxx_runtime_first_and_it_binds_only_to_itself() -> None:
    """Kronk(): the runtime is loaded on its own before numpy and llama.cpp; nothing captures it."""
    report = run(KRONK)
    assert report.returncode == 0, report.output
    assert report.loaded_by["libstdc++.so.6"].startswith("dynamically loaded by")
    assert report.captured() == []
    # numpy (imported by plugins after the preload) now binds its copies' names to libstdc++.
    numpy_own = {
        symbol: target
        for (binder, symbol), target in report.bindings.items()
        if binder.startswith("_multiarray_umath") and symbol.startswith("_ZTISt")
    }
    assert numpy_own and set(numpy_own.values()) == {"libstdc++.so.6"}


def _llama_cpp_links_libstdcxx() -> bool:
    """Whether the libllama that `import llama_cpp` binds needs libstdc++ (a gcc build), or
    carries its own C++ runtime (the noxfile's zig build links libc++ in, its ABI hidden)."""
    spec = importlib.util.find_spec("llama_cpp")
    assert spec is not None and spec.origin is not None
    folder = os.environ.get("LLAMA_CPP_LIB_PATH") or Path(spec.origin).parent / "lib"
    needed = subprocess.run(
        ["ldd", str(Path(folder) / "libllama.so")], capture_output=True, text=True, check=True
    )
    return "libstdc++" in needed.stdout


def test_llama_cpp_imported_first_is_captured_by_llama_cpp_itself() -> None:
    """The order that worked on the GPU is not clean either: libllama's copies capture libstdc++.
    A zig build has nothing to capture it with: numpy loads libstdc++, and binds it alone."""
    report = run('import os; print(f"pid={os.getpid()}", flush=True)\nimport llama_cpp\n')
    captured = report.captured()
    if not _llama_cpp_links_libstdcxx():
        assert report.loaded_by["libstdc++.so.6"].startswith("needed by _multiarray_umath")
        assert all(target.startswith("_multiarray_umath") for _, target in captured)
        return
    assert report.loaded_by["libstdc++.so.6"].startswith("needed by libllama")
    assert captured
    assert {target for _, target in captured} <= {"libllama.so", "libggml.so", "libggml-base.so"}


# A C++ library with its own static copy of the runtime, as llama.cpp's CUDA build was on
# the GPU machine (its libraries needed no libstdc++.so and defined ~7,900 of its symbols).
STATIC_RUNTIME_SOURCE = """
#include <cstring>
#include <sstream>
#include <string>
extern "C" int format_long(long value, char * out, int size) {
    std::ostringstream stream;
    stream << value;
    std::string text = stream.str();
    std::strncpy(out, text.c_str(), size);
    return (int) text.size();
}
"""
STATIC_RUNTIME_CALL = """
import ctypes
library = ctypes.CDLL(sys.argv[-1], mode=ctypes.RTLD_GLOBAL)
out = ctypes.create_string_buffer(32)
library.format_long(1234567, out, 32)
print(out.value.decode(), flush=True)
"""
M_INSERT_LONG = "_ZNSo9_M_insertIlEERSoT_"  # std::ostream::_M_insert<long>, the crash frame
NUM_PUT_ID = "_ZNSt7num_putIcSt19ostreambuf_iteratorIcSt11char_traitsIcEEE2idE"


@pytest.fixture(scope="module")
def static_runtime_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("g++")
    if compiler is None:  # a machine where the noxfile compiled llama.cpp with zig's clang
        pytest.skip("needs g++: zig's clang links libc++, not a static copy of libstdc++")
    folder = tmp_path_factory.mktemp("static-runtime")
    (folder / "format.cpp").write_text(STATIC_RUNTIME_SOURCE)
    library = folder / "libformat_static.so"
    subprocess.run(
        [compiler, "-O2", "-fPIC", "-shared", "-static-libstdc++", "-static-libgcc",
         str(folder / "format.cpp"), "-o", str(library)],
        check=True,
    )  # fmt: skip
    return library


def _binds(report_path: Path, snippet: str) -> dict[str, str]:
    report = run('import os, sys; print(f"pid={os.getpid()}", flush=True)\n' + snippet,
                 str(report_path))  # fmt: skip
    assert report.returncode == 0, report.output
    assert "1234567" in report.output
    name = report_path.name
    return {
        symbol: target
        for (binder, symbol), target in report.bindings.items()
        if binder == name and symbol in (M_INSERT_LONG, NUM_PUT_ID)
    }


def test_a_static_runtime_copy_after_numpy_mixes_two_runtimes(
    static_runtime_library: Path,
) -> None:
    """The GPU crash's mechanism: the facet id is unique, so it binds to the runtime numpy
    loaded, while the copy's stream output (and its id counter) stay its own."""
    binds = _binds(
        static_runtime_library, "import numpy._core._multiarray_umath\n" + STATIC_RUNTIME_CALL
    )
    assert binds[NUM_PUT_ID] == "libstdc++.so.6"
    assert binds[M_INSERT_LONG] == static_runtime_library.name


@pytest.mark.parametrize("numpy_first", [False, True], ids=["kronk-first", "numpy-first"])
def test_kronk_binds_a_static_runtime_copy_to_the_one_runtime(
    static_runtime_library: Path, numpy_first: bool
) -> None:
    """With Kronk's pin (global, first, or promoted when numpy came first) the copy's
    references to what the runtime exports all bind to libstdc++: one runtime."""
    snippet = (
        ("import numpy._core._multiarray_umath\n" if numpy_first else "")
        + "from pathlib import Path\n"
        + "from kronk_llamacpp.native import pin_cxx_runtime\n"
        + "assert pin_cxx_runtime(Path(sys.argv[-1]))[0] is not None\n"
        + "import numpy._core._multiarray_umath\n"
        + STATIC_RUNTIME_CALL
    )
    binds = _binds(static_runtime_library, snippet)
    assert binds == {M_INSERT_LONG: "libstdc++.so.6", NUM_PUT_ID: "libstdc++.so.6"}
