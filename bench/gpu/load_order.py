"""The CUDA load crash, case by case: import order, who loads the C++ runtime, where it binds.

Each case loads MODEL in its own process with glibc's LD_DEBUG=bindings,files and reports
its exit status (-11: SIGSEGV), who loaded libstdc++, which of libstdc++'s references
bound outside the C++ runtime, and where every reference to std::ostream::_M_insert<long>
(the crashing frame) and the num_put facet id bound. Run on the GPU machine by
bench/gpu/run.sh; works on a CPU too.

usage: load_order.py MODEL.gguf [CASE ...]
"""

from __future__ import annotations

import re
import sys

from ld_bindings import run

HEAD = 'import os, sys; print(f"pid={os.getpid()}", flush=True); path = sys.argv[-1]\n'
LOAD = """
import llama_cpp
llama_cpp.llama_backend_init()
model = llama_cpp.llama_model_load_from_file(path.encode(), llama_cpp.llama_model_default_params())
print("loaded", bool(model), flush=True)
"""
KRONK = """
from pathlib import Path
from kronk_core import Kronk, KronkConfig, ModelConfig
config = ModelConfig(
    model_path=Path(path), n_seq_max=4, context_window=8192, templates={"template": "chatml"}
)
Kronk(KronkConfig(default_model="m", models={"m": config})).load("m")
print("loaded True", flush=True)
"""
CASES = {
    # The crash as isolated on the H200: numpy's core extension first.
    "numpy_first": "import numpy._core._multiarray_umath\n" + LOAD,
    # What worked there: llama_cpp (libllama) first.
    "llama_cpp_first": LOAD + "import numpy\n",
    # Kronk's order (the fix): the C++ runtime alone and global, before plugins and numpy.
    "kronk": KRONK,
    # A program that imports numpy before Kronk: captures are made before Kronk can act.
    "numpy_then_kronk": "import numpy\n" + KRONK,
}
M_INSERT_LONG = "_ZNSo9_M_insertIlEERSoT_"
# A locale facet id: a unique symbol, so the first definition loaded serves everyone.
NUM_PUT_ID = "_ZNSt7num_putIcSt19ostreambuf_iteratorIcSt11char_traitsIcEEE2idE"
# Mangled names in namespace std (functions, members, type_info, vtables).
STD = re.compile(r"^_Z(St|N(K)?S[tiod]|T[IVS]S[tiod])")
LLAMA_CPP = ("libllama", "libggml")
RUNTIME = re.compile(r"^(libstdc\+\+|libc\.so|libm\.so|libgcc_s|ld-linux)")


def main() -> int:
    model = sys.argv[1]
    chosen = sys.argv[2:] or list(CASES)
    for name in chosen:
        report = run(HEAD + CASES[name], model, timeout=300)
        print(
            f"== {name}: exit status {report.returncode}"
            f"{' (SIGSEGV)' if report.returncode in (-11, 139) else ''}"
        )
        print(f"   libstdc++: {report.loaded_by.get('libstdc++.so.6', 'not loaded')}")
        captured = report.captured()
        print(f"   libstdc++ references bound outside the C++ runtime: {len(captured)}")
        for symbol, target in captured:
            print(f"     {symbol} -> {target}")
        for label, symbol in (("_M_insert<long>", M_INSERT_LONG), ("num_put id", NUM_PUT_ID)):
            for binder, target in report.bound(symbol):
                print(f"   {label}: {binder} -> {target}")
        # llama.cpp's references to std:: symbols bound outside the C++ runtime and outside
        # llama.cpp itself (its libraries share their template instantiations, as usual).
        foreign = sorted(
            (binder, symbol, target)
            for (binder, symbol), target in report.bindings.items()
            if binder.startswith(LLAMA_CPP)
            and STD.match(symbol)
            and not RUNTIME.match(target)
            and not target.startswith(LLAMA_CPP)
        )
        print(f"   llama.cpp std:: references bound to other objects: {len(foreign)}")
        for binder, symbol, target in foreign:
            print(f"     {binder}: {symbol} -> {target}")
        if report.returncode != 0:
            print("   output tail: " + report.output[-600:].replace("\n", "\n     "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
