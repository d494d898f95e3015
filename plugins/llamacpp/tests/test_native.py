"""The load-order crash's mechanism, shown with the real loader: who binds the C++ runtime.

A shared library's references are resolved in the scope of whatever loaded it first
(and Python loads extensions with RTLD_NOW, so all of them at once). numpy's core
extension carries copies of a few libstdc++ symbols; when it loads libstdc++ first,
libstdc++'s own references bind to those copies for the rest of the process. Kronk loads
the C++ runtime on its own, first, into the global scope (kronk_llamacpp.native), so that
in a Kronk process it binds only to itself. Linux/glibc only: LD_DEBUG is glibc's.
"""

from __future__ import annotations

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


def test_llama_cpp_imported_first_is_captured_by_llama_cpp_itself() -> None:
    """The order that worked on the GPU is not clean either: libllama's copies capture libstdc++."""
    report = run('import os; print(f"pid={os.getpid()}", flush=True)\nimport llama_cpp\n')
    assert report.loaded_by["libstdc++.so.6"].startswith("needed by libllama")
    captured = report.captured()
    assert captured
    assert {target for _, target in captured} <= {"libllama.so", "libggml.so", "libggml-base.so"}
