"""Which object each symbol reference bound to, from glibc's `LD_DEBUG=bindings,files` output.

Used by the load-order regression test and bench/gpu_load_order.py: run a Python snippet
with the dynamic loader's debug output on, then ask which references of the C++ runtime
(libstdc++) bound outside it, and who loaded it.

Usage: python scripts/ld_bindings.py SNIPPET     (prints the report for `python -c SNIPPET`)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

_BINDING = re.compile(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: \w+ symbol `([^']+)'")
_LOADED = re.compile(r"file=(\S+) \[\d+\];\s+(needed by|dynamically loaded by) (\S+)")
# The C runtime pieces the C++ runtime may bind to without anyone capturing anything.
_RUNTIME = re.compile(r"(libstdc\+\+|libc\.so|libm\.so|libgcc_s|ld-linux|linux-vdso)")


@dataclass(frozen=True)
class Report:
    bindings: dict[tuple[str, str], str]  # (binder, symbol) -> target, by file name
    loaded_by: dict[str, str]  # file name -> "needed by X" / "dynamically loaded by X"
    returncode: int = 0  # the snippet's exit status (-11: it crashed with SIGSEGV)
    output: str = ""
    # The executable, by file name. Where Python is linked statically (Debian's is), it holds
    # copies of the C library's stdin, stdout and stderr (copy relocations), to which every
    # library's references bind: not a capture.
    program: str = ""

    def bound(self, symbol: str) -> list[tuple[str, str]]:
        """(binder, target) of every reference to `symbol`."""
        return sorted((b, t) for (b, s), t in self.bindings.items() if s == symbol)

    def captured(self) -> list[tuple[str, str]]:
        """(symbol, target) of libstdc++'s own references bound outside the runtime."""
        return sorted(
            (symbol, target)
            for (binder, symbol), target in self.bindings.items()
            if binder.startswith("libstdc++")
            and not _RUNTIME.match(target)
            and target != self.program
        )


def parse(text: str) -> Report:
    bindings: dict[tuple[str, str], str] = {}
    loaded_by: dict[str, str] = {}
    for line in text.splitlines():
        if found := _BINDING.search(line):
            binder, target, symbol = found.groups()
            bindings[(Path(binder).name, symbol)] = Path(target).name
        elif (loaded := _LOADED.search(line)) and Path(loaded.group(1)).name not in loaded_by:
            name, how, by = loaded.groups()
            loaded_by[Path(name).name] = f"{how} {Path(by).name}"
    return Report(bindings, loaded_by)


def run(
    snippet: str,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> Report:
    """Run `python -c snippet ARGS` with LD_DEBUG on; the report of its own process.

    The snippet must print `pid=<its pid>` first (flushed), so that its own debug file is
    found among its children's.
    """
    with tempfile.TemporaryDirectory() as folder:
        prefix = Path(folder) / "ld"
        environment = {
            **os.environ,
            **(env or {}),
            "LD_DEBUG": "bindings,files",
            "LD_DEBUG_OUTPUT": str(prefix),
        }
        done = subprocess.run(
            [sys.executable, "-c", snippet, *args],
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        found = re.search(r"^pid=(\d+)$", done.stdout, re.MULTILINE)
        if found is None:
            raise RuntimeError(f"no pid=N line from the snippet: {done.stderr[-2000:]}")
        # One file per process (LD_DEBUG_OUTPUT.PID).
        ours = parse(prefix.with_name(f"ld.{found.group(1)}").read_text(errors="replace"))
        output = done.stdout + done.stderr
        program = Path(sys.executable).name
        return Report(ours.bindings, ours.loaded_by, done.returncode, output, program)


def main() -> None:
    report = run(sys.argv[1])
    print("exit status:", report.returncode)
    print("libstdc++ loaded:", report.loaded_by.get("libstdc++.so.6", "not loaded"))
    captured = report.captured()
    print(f"libstdc++ references bound outside the C++ runtime: {len(captured)}")
    for symbol, target in captured:
        print(f"  {symbol} -> {target}")


if __name__ == "__main__":
    main()
