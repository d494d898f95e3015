"""Loading llama.cpp's shared libraries: which build (processor), and in what order.

`llama_cpp` binds its library when it is first imported, so the choice is made once per
process, here, before that import:

- `KRONK_PROCESSOR` set (`cpu`, `cuda`, `hip`, `vulkan`, `metal`): the libraries
  `kronk libs` installed in `<KRONK_LIB_PATH>/<processor>` (default `~/.kronk/libraries`);
- else `LLAMA_CPP_LIB_PATH` if set (llama-cpp-python's own variable: a build of your own);
- else the processor `kronk libs` last installed in that folder, if its libraries are there;
- else the CPU libraries bundled in the llama-cpp-python wheel.

On Linux the C++ runtime (the system's libstdc++) is loaded first, on its own and into
the global scope, whether llama.cpp links it or carries a static copy of it (as CUDA
builds made with some toolchains do). The locale facets' `id` objects are unique symbols:
the first definition loaded serves the whole process, while the rest of the locale
machinery (the id counter, the classic locale) stays with each copy. A static copy in
libggml-cuda that meets ids already defined by a libstdc++ loaded earlier (numpy loads
it) indexes its locale with another runtime's numbers and crashes at its first stream
output. With the system runtime global and first, every copy's references to what the
runtime exports bind to it: one C++ runtime in the process. See
docs/gpu.md ("The load-order crash").
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from kronk_core.contract import ConfigError, default_base_path

log = logging.getLogger(__name__)

PROCESSORS = ("cpu", "cuda", "hip", "vulkan", "metal")
MANIFEST = "kronk-libs.json"
# In the libraries folder: the processor `kronk libs` last installed, used without
# KRONK_PROCESSOR.
REMEMBERED = "kronk-processor.json"
_CXX_RUNTIME = "libstdc++.so.6"
_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class NativeLibraries:
    """What this process loaded: for `kronk devices` and the logs."""

    processor: str | None  # None: no kronk libs build (LLAMA_CPP_LIB_PATH or the wheel)
    directory: Path  # where libllama came from
    cxx_runtime: str | None  # the C++ runtime pinned first (Linux), its path
    cxx_runtime_loaded_before: bool  # another extension had loaded it before llama.cpp


_loaded: NativeLibraries | None = None
_error: ConfigError | None = None


def libraries_root() -> Path:
    """Where `kronk libs` installs: KRONK_LIB_PATH, else <base path>/libraries."""
    explicit = os.environ.get("KRONK_LIB_PATH")
    return Path(explicit).expanduser() if explicit else default_base_path() / "libraries"


def selected_processor() -> str | None:
    value = os.environ.get("KRONK_PROCESSOR", "").strip().lower()
    if not value:
        return None
    if value not in PROCESSORS:
        raise ConfigError(
            "KRONK_PROCESSOR", f"must be one of {', '.join(PROCESSORS)}, got {value!r}"
        )
    return value


def remembered_processor() -> str | None:
    """The processor `kronk libs` last installed here, if its libraries are still there."""
    root = libraries_root()
    try:
        processor = json.loads((root / REMEMBERED).read_text())["processor"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if processor not in PROCESSORS or not library_file(root / processor).is_file():
        return None
    return str(processor)


def remember_processor(root: Path, processor: str) -> None:
    (root / REMEMBERED).write_text(json.dumps({"processor": processor}) + "\n")


def library_file(directory: Path) -> Path:
    name = {"darwin": "libllama.dylib", "win32": "llama.dll"}.get(sys.platform, "libllama.so")
    return directory / name


def _bundled_directory() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        raise ConfigError("llamacpp", "llama-cpp-python is not installed")
    return Path(spec.origin).parent / "lib"


def choose_directory() -> tuple[str | None, Path]:
    """The processor and the folder whose libllama this process should load."""
    processor = selected_processor()
    if processor is not None:
        directory = libraries_root() / processor
        if not library_file(directory).is_file():
            raise ConfigError(
                "KRONK_PROCESSOR",
                f"no {processor} llama.cpp libraries in {directory}: install them with "
                f"`kronk libs --processor {processor}` (or unset KRONK_PROCESSOR for the "
                "CPU libraries bundled with llama-cpp-python)",
            )
        return processor, directory
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    if override:
        return None, Path(override).expanduser()
    remembered = remembered_processor()
    if remembered is not None:
        return remembered, libraries_root() / remembered
    return None, _bundled_directory()


def _resolved_cxx_runtime(library: Path) -> str:
    """The libstdc++ `library` resolves to (as `ldd` reports it), else the system's by soname.

    A library with a static copy of the runtime needs none, and is pinned to the system's
    all the same (numpy and other extensions load that one).
    """
    try:
        listing = subprocess.run(
            ["ldd", str(library)], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return _CXX_RUNTIME
    match = re.search(r"^\s*libstdc\+\+\.so\.6 => (/\S+)", listing, re.MULTILINE)
    return match.group(1) if match else _CXX_RUNTIME


def pin_cxx_runtime(library: Path) -> tuple[str | None, bool]:
    """Load the C++ runtime `library` needs on its own, into the global scope (Linux only).

    Returns its path and whether something else had loaded it already; then it is only
    promoted to the global scope, which still wins every lookup not yet made.
    """
    if not sys.platform.startswith("linux"):
        return None, False  # Mach-O and PE bind each import to its library: nothing to capture
    runtime = _resolved_cxx_runtime(library)
    mode = os.RTLD_NOW | os.RTLD_GLOBAL
    try:
        ctypes.CDLL(runtime, mode=mode | os.RTLD_NOLOAD)
        return runtime, True
    except OSError:
        pass
    try:
        ctypes.CDLL(runtime, mode=mode)
    except OSError:
        return None, False  # no C++ runtime installed: llama.cpp carries its own, alone
    return runtime, False


def _already_imported(directory: Path) -> None:
    """llama_cpp imported before Kronk chose: fine if it loaded the same folder."""
    bindings = sys.modules.get("llama_cpp.llama_cpp")
    if bindings is None:
        return
    loaded_from = Path(getattr(bindings, "_base_path", directory))
    if loaded_from.resolve() != directory.resolve():
        raise ConfigError(
            "KRONK_PROCESSOR",
            f"llama_cpp was imported before Kronk chose its libraries and loaded {loaded_from}, "
            f"not {directory}; import kronk_core (or kronk_llamacpp) first",
        )


def prepare() -> None:
    """Choose the libraries and pin the C++ runtime, before anything imports llama_cpp.

    Never raises: a bad choice (KRONK_PROCESSOR without libraries) is kept and raised by
    `load()`, so that `kronk libs` still runs to install what is missing.
    """
    global _loaded, _error
    with _lock:
        if _loaded is not None or _error is not None:
            return
        try:
            processor, directory = choose_directory()
            _already_imported(directory)
        except ConfigError as exc:
            _error = exc
            return
        runtime, before = pin_cxx_runtime(library_file(directory))
        if before and "llama_cpp.llama_cpp" not in sys.modules:
            log.warning(
                "the C++ runtime %s was loaded by another extension (imported before Kronk, "
                "e.g. numpy) before llama.cpp; a few of its references may be bound to that "
                "extension's copies. If loading a model crashes, import kronk_llamacpp before it",
                runtime,
            )
        if processor is not None or "LLAMA_CPP_LIB_PATH" in os.environ:
            os.environ["LLAMA_CPP_LIB_PATH"] = str(directory)
            # The multimodal library (projectors) must come from the same build.
            os.environ.setdefault("MTMD_CPP_LIB", str(directory))
        _loaded = NativeLibraries(processor, directory, runtime, before)


def select(processor: str, source: str = "KRONK_PROCESSOR") -> NativeLibraries:
    """The libraries of `processor` for this process (`kronk server start --processor`):
    those chosen already, else chosen now if llama_cpp is not loaded yet; ConfigError
    naming `source`, and the `kronk libs` command when they are not installed."""
    global _loaded, _error
    os.environ["KRONK_PROCESSOR"] = processor
    with _lock:
        if _loaded is not None and _loaded.processor == processor:
            return _loaded
        if "llama_cpp.llama_cpp" not in sys.modules:
            if _loaded is not None and os.environ.get("MTMD_CPP_LIB") == str(_loaded.directory):
                del os.environ["MTMD_CPP_LIB"]  # ours, from the earlier choice
            _loaded = _error = None
    prepare()
    if _loaded is not None and _loaded.processor == processor:
        return _loaded
    if _error is not None:
        raise ConfigError(source, _error.message.removeprefix("KRONK_PROCESSOR: "))
    chosen = _loaded.processor if _loaded is not None else None
    raise ConfigError(
        source, f"llama.cpp's libraries ({chosen or 'not from kronk libs'}) are loaded already"
    )


def load() -> NativeLibraries:
    """Load llama.cpp's libraries once per process; ConfigError when the choice is wrong."""
    prepare()
    if _error is not None:
        raise _error
    assert _loaded is not None
    if "llama_cpp.llama_cpp" not in sys.modules:
        import llama_cpp  # noqa: F401  (binds libllama from LLAMA_CPP_LIB_PATH or the wheel)

        log.info(
            "llama.cpp libraries: %s (%s)%s",
            _loaded.directory,
            _loaded.processor or "no kronk libs build",
            f"; C++ runtime {_loaded.cxx_runtime} loaded first"
            if _loaded.cxx_runtime and not _loaded.cxx_runtime_loaded_before
            else "",
        )
    return _loaded
