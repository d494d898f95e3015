"""`kronk libs`: build llama.cpp's shared libraries for one processor and install them.

The source is the sdist of the llama-cpp-python version that is installed (its ctypes
bindings must match the libraries exactly); the build is llama.cpp's own CMake build of
the `llama` target with BUILD_SHARED_LIBS; the result lands in
`<KRONK_LIB_PATH>/<processor>/` with a manifest, and `KRONK_PROCESSOR=<processor>` makes
the llamacpp backend load it (see native.py).

With `rpc`, the same build also has ggml's RPC backend (models spread over `rpc_servers`)
and llama.cpp's `ggml-rpc-server` worker, installed beside the libraries (`kronk rpc start`).
With `tools`, llama.cpp's own programs of the same build are installed beside them too
(llama-server and llama-batched-bench: the GPU check's C++ side). A CUDA build can take its
toolkit from packages (cuda_toolkit.py) on a machine that has none.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

from kronk_llamacpp.cuda_toolkit import cmake_arguments as cuda_cmake_arguments
from kronk_llamacpp.native import MANIFEST, PROCESSORS, remember_processor

DISTRIBUTION = "llama-cpp-python"
SDIST_PREFIX = "llama_cpp_python"

# Only the libraries (llama, and mtmd for vision and audio projectors): no tools, tests,
# examples, server, network or web UI.
COMMON_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DLLAMA_BUILD_COMMON=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_MTMD=ON",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_CCACHE=OFF",
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
)
# The RPC backend, and its worker: a tool, so llama.cpp's tools (and the common library they
# share) are configured too; only the worker's target is built.
RPC_ARGS = ("-DGGML_RPC=ON", "-DLLAMA_BUILD_COMMON=ON", "-DLLAMA_BUILD_TOOLS=ON")
RPC_TARGET = "ggml-rpc-server"
RPC_HEADER = Path("ggml") / "include" / "ggml-rpc.h"
# llama.cpp's programs that `tools` may name, and what configuring them takes (the server
# without its web UI, which would need npm or a download).
TOOLS = ("llama-server", "llama-batched-bench", "llama-bench", "llama-cli")
TOOL_ARGS = (
    "-DLLAMA_BUILD_COMMON=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
)
PROCESSOR_ARGS = {
    "cpu": (),
    "cuda": ("-DGGML_CUDA=ON",),
    "hip": ("-DGGML_HIP=ON",),
    "vulkan": ("-DGGML_VULKAN=ON",),
    "metal": ("-DGGML_METAL=ON", "-DGGML_METAL_EMBED_LIBRARY=ON"),
}


def unpack(archive: Path, into: Path) -> None:
    """Extract a source archive, through the `data` filter (nothing linked or written outside
    `into`) where Python has it: 3.11.4 and later, not Debian 12's 3.11.2."""
    with tarfile.open(archive) as opened:
        if hasattr(tarfile, "data_filter"):
            opened.extractall(into, filter="data")
        else:
            opened.extractall(into)


class LibsError(Exception):
    """What stops a build, said so that the user knows what to install or change."""


@dataclass(frozen=True, slots=True)
class Manifest:
    processor: str
    llama_cpp_python: str
    cmake_args: list[str]
    platform: str
    built_at: str
    # The RPC protocol version (major.minor.patch) of a build with the RPC backend, else None.
    rpc_protocol: str | None = None


def _find(*names: str) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def _nvcc() -> str | None:
    candidates = [os.environ.get("CUDACXX", ""), shutil.which("nvcc") or ""]
    candidates += [str(p / "bin" / "nvcc") for p in sorted(Path("/usr/local").glob("cuda*"))]
    candidates.append("/opt/cuda/bin/nvcc")
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def _cuda_roots(nvcc: str) -> list[Path]:
    roots = [Path(os.environ[name]) for name in ("CUDA_PATH", "CUDA_HOME") if os.environ.get(name)]
    roots.append(Path(nvcc).resolve().parent.parent)
    roots += [*sorted(Path("/usr/local").glob("cuda*")), Path("/usr")]
    return roots


def _cublas(nvcc: str) -> bool:
    """cuBLAS (ggml-cuda links it): its header in the toolkit, as CMake's FindCUDAToolkit looks."""
    for root in _cuda_roots(nvcc):
        includes = [root / "include", *root.glob("targets/*/include")]
        if any((include / "cublas_v2.h").is_file() for include in includes):
            return True
    return False


def _hipconfig() -> str | None:
    found = _find("hipconfig")
    fallback = Path("/opt/rocm/bin/hipconfig")
    return found or (str(fallback) if os.access(fallback, os.X_OK) else None)


def _hip_environment() -> dict[str, str]:
    """HIP builds compile with ROCm's clang, which CMake finds through these (llama.cpp's
    build instructions set them the same way)."""
    hipconfig = _hipconfig()
    if hipconfig is None:
        return {}

    def ask(flag: str) -> str:
        return subprocess.run(
            [hipconfig, flag], capture_output=True, text=True, check=False
        ).stdout.strip()

    return {"HIPCXX": f"{ask('-l')}/clang", "HIP_PATH": ask("-R")}


def _vulkan_headers() -> bool:
    sdk = os.environ.get("VULKAN_SDK")
    roots = [Path(sdk) / "include"] if sdk else []
    roots += [Path("/usr/include"), Path("/usr/local/include"), Path("/opt/homebrew/include")]
    return any((root / "vulkan" / "vulkan.h").is_file() for root in roots)


def missing_tools(processor: str, *, cuda_toolkit: Path | None = None) -> list[str]:
    """What the build for `processor` needs and this machine lacks, each with how to get it
    (a CUDA toolkit put together from packages stands for an installed one)."""
    missing = []
    if _find("cmake") is None:
        missing.append("cmake (pip install cmake, or your system's package)")
    if os.environ.get("CXX") is None and _find("c++", "g++", "clang++") is None:
        missing.append("a C++ compiler (g++ or clang++; Debian/Ubuntu: apt install g++)")
    if processor == "cuda" and cuda_toolkit is None:
        nvcc = _nvcc()
        if nvcc is None:
            missing.append(
                "nvcc, the CUDA toolkit's compiler (install the CUDA toolkit; if it is "
                "installed outside PATH, set CUDACXX to its nvcc; or build with "
                "--cuda-toolkit 13 or 12)"
            )
        elif not _cublas(nvcc):
            missing.append(
                f"cuBLAS (headers and library) next to {nvcc}: install the CUDA toolkit's "
                "cuBLAS (e.g. the cuda-libraries-dev package), or set CUDA_PATH to a full toolkit"
            )
    if processor == "hip" and _hipconfig() is None:
        missing.append(
            "hipconfig, ROCm's HIP toolkit (install ROCm; if it is installed outside PATH, "
            "add /opt/rocm/bin to PATH)"
        )
    if processor == "vulkan":
        if _find("glslc") is None:
            missing.append("glslc, the Vulkan shader compiler (Vulkan SDK; apt install glslc)")
        if not _vulkan_headers():
            missing.append(
                "the Vulkan headers and loader (Vulkan SDK with VULKAN_SDK set; "
                "apt install libvulkan-dev)"
            )
    if processor == "metal":
        if sys.platform != "darwin":
            missing.append("macOS: Metal libraries build only on a Mac")
        elif _find("xcrun") is None:
            missing.append("Xcode command line tools (xcode-select --install)")
    return missing


def _library_files(build: Path) -> list[Path]:
    patterns = {"darwin": ("*.dylib",), "win32": ("*.dll",)}.get(sys.platform, ("*.so", "*.so.*"))
    found = {path for pattern in patterns for path in (build / "bin").glob(pattern)}
    return sorted(found)


def program_name(target: str) -> str:
    """A llama.cpp program's executable, as its build names it."""
    return target + (".exe" if sys.platform == "win32" else "")


def worker_name() -> str:
    """The RPC worker's executable."""
    return program_name(RPC_TARGET)


def rpc_protocol(header: Path) -> str:
    """major.minor.patch of the RPC protocol, from ggml-rpc.h: clients and workers of
    different major versions refuse each other."""
    text = header.read_text()
    parts = []
    for part in ("MAJOR", "MINOR", "PATCH"):
        found = re.search(rf"#define\s+RPC_PROTO_{part}_VERSION\s+(\d+)", text)
        if found is None:
            raise LibsError(f"{header} names no RPC_PROTO_{part}_VERSION")
        parts.append(found.group(1))
    return ".".join(parts)


class BuildProgress:
    """Says how far a build is, from the progress its generator prints: Ninja's
    `[12/345]` or Make's `[ 45%]`; a line each time it passes another tenth."""

    _NINJA = re.compile(r"^\[(\d+)/(\d+)\]")
    _MAKE = re.compile(r"^\[\s*(\d+)%\]")

    def __init__(self, say: Callable[[str], None], processor: str) -> None:
        self._say = say
        self._processor = processor
        self._shown = 0

    def read(self, line: str) -> None:
        if ninja := self._NINJA.match(line):
            done, total = int(ninja.group(1)), int(ninja.group(2))
            percent = 100 * done // total if total else 0
            detail = f" ({done}/{total})"
        elif make := self._MAKE.match(line):
            percent, detail = int(make.group(1)), ""
        else:
            return
        if percent >= self._shown + 10 or (percent == 100 and self._shown < 100):
            self._shown = percent - percent % 10
            self._say(f"building the {self._processor} libraries: {percent}%{detail}")

    def finish(self) -> None:
        """A build with nothing left to compile (an earlier tree, reused) prints no progress."""
        if self._shown < 100:
            self._shown = 100
            self._say(f"building the {self._processor} libraries: 100%")


class LibsBuilder:
    """One build: `root/<processor>` is the install, `root/build/<processor>` the CMake tree."""

    def __init__(
        self,
        processor: str,
        root: Path,
        *,
        source: Path | None = None,
        jobs: int | None = None,
        cmake_args: Sequence[str] = (),
        rpc: bool = False,
        tools: Sequence[str] = (),
        cuda_toolkit: Path | None = None,
        say: Callable[[str], None] = print,
    ) -> None:
        if processor not in PROCESSORS:
            raise LibsError(f"unknown processor {processor!r}: choose {', '.join(PROCESSORS)}")
        self.processor = processor
        self.root = root
        self.source = source
        self.jobs = jobs or os.cpu_count() or 1
        self.version = version(DISTRIBUTION)
        self.rpc = rpc
        unknown = sorted(set(tools) - set(TOOLS))
        if unknown:
            raise LibsError(f"unknown tools {unknown}: choose from {', '.join(TOOLS)}")
        if cuda_toolkit is not None and processor != "cuda":
            raise LibsError(f"a CUDA toolkit was given for a {processor} build")
        self.tools = list(tools)
        self.cuda_toolkit = cuda_toolkit
        extra = [*(RPC_ARGS if rpc else ()), *(TOOL_ARGS if tools else ())]
        overridden = {arg.split("=")[0] for arg in extra}
        common = [arg for arg in COMMON_ARGS if arg.split("=")[0] not in overridden]
        self.cmake_args = [*common, *dict.fromkeys(extra), *PROCESSOR_ARGS[processor]]
        if cuda_toolkit is not None:
            self.cmake_args += cuda_cmake_arguments(cuda_toolkit)
        self.cmake_args += cmake_args
        self.say = say
        self.target = root / processor
        self.build_dir = root / "build" / processor
        self.log = root / "build" / f"{processor}.log"

    def installed(self) -> Manifest | None:
        try:
            return Manifest(**json.loads((self.target / MANIFEST).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def up_to_date(self) -> bool:
        found = self.installed()
        return (
            found is not None
            and found.llama_cpp_python == self.version
            and found.cmake_args == self.cmake_args
            and any(self.target.glob("*llama*"))
            and all((self.target / program_name(tool)).is_file() for tool in self.tools)
        )

    def run(self, *, force: bool = False) -> Path:
        missing = missing_tools(self.processor, cuda_toolkit=self.cuda_toolkit)
        if missing:
            raise LibsError(
                f"cannot build the {self.processor} libraries; missing:\n  - "
                + "\n  - ".join(missing)
            )
        if not force and self.up_to_date():
            self.say(f"{self.processor} libraries for {DISTRIBUTION} {self.version} are up to date")
            remember_processor(self.root, self.processor)
            return self.target
        sources = self._sources()
        started = time.monotonic()
        self._cmake(
            "configure", "-S", str(sources / "vendor" / "llama.cpp"), "-B", str(self.build_dir),
            *self._generator(), *self.cmake_args, f"-DCMAKE_INSTALL_RPATH={self._origin()}",
        )  # fmt: skip
        targets = ["llama", "mtmd", *([RPC_TARGET] if self.rpc else []), *self.tools]
        self._cmake(
            "build", "--build", str(self.build_dir), "--config", "Release",
            "-j", str(self.jobs), "--target", *targets,
        )  # fmt: skip
        self._install(sources)
        self.say(f"built in {time.monotonic() - started:.0f} s; installed in {self.target}")
        return self.target

    def _origin(self) -> str:
        return "@loader_path" if sys.platform == "darwin" else "$ORIGIN"

    def _generator(self) -> list[str]:
        return ["-G", "Ninja"] if _find("ninja") else []

    def _sources(self) -> Path:
        """The unpacked sdist of the installed llama-cpp-python version."""
        name = f"{SDIST_PREFIX}-{self.version}"
        unpacked = self.root / "src" / name
        if (unpacked / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
            return unpacked
        archive = self.source or self._download(name)
        if archive.is_dir():
            return archive
        self.say(f"unpacking {archive}")
        partial = unpacked.with_name(name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        unpack(archive, partial)
        inner = partial / name
        if not (inner / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
            raise LibsError(f"{archive} is not the {DISTRIBUTION} {self.version} sdist")
        inner.replace(unpacked)
        shutil.rmtree(partial)
        return unpacked

    def _download(self, name: str) -> Path:
        folder = self.root / "src"
        archive = folder / f"{name}.tar.gz"
        if archive.is_file():
            return archive
        folder.mkdir(parents=True, exist_ok=True)
        self.say(f"downloading the {DISTRIBUTION} {self.version} sdist (pip)")
        # The sdist alone: `--no-binary :all:` would also have pip build the sdist's build
        # requirements (CMake itself) from source, to read its metadata.
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", DISTRIBUTION,
            f"{DISTRIBUTION}=={self.version}", "-d", str(folder),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not archive.is_file():
            raise LibsError(
                f"could not download the {DISTRIBUTION} {self.version} sdist: "
                f"{done.stderr.strip()[-500:]}\n(offline? pass it with --source)"
            )
        return archive

    def _cmake(self, step: str, *args: str) -> None:
        self.say(f"cmake {step} ({self.processor}); log: {self.log}")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        environment = {**os.environ}
        if self.processor == "hip":
            environment = {**_hip_environment(), **environment}
        progress = BuildProgress(self.say, self.processor)
        with self.log.open("a") as log:
            log.write(f"\n$ cmake {' '.join(args)}\n")
            log.flush()
            process = subprocess.Popen(
                ["cmake", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, errors="replace", env=environment,
            )  # fmt: skip
            assert process.stdout is not None
            for line in process.stdout:
                log.write(line)
                progress.read(line)
            returncode = process.wait()
        if returncode != 0:
            tail = self.log.read_text(errors="replace").splitlines()[-30:]
            raise LibsError(f"cmake {step} failed (full log: {self.log}):\n" + "\n".join(tail))
        if step == "build":
            progress.finish()

    def _install(self, sources: Path) -> None:
        files = _library_files(self.build_dir)
        if not any("llama" in path.name for path in files):
            raise LibsError(f"the build produced no llama library in {self.build_dir / 'bin'}")
        protocol = None
        if self.rpc:
            worker = self.build_dir / "bin" / worker_name()
            if not worker.is_file():
                raise LibsError(f"the build produced no {worker.name} in {worker.parent}")
            files.append(worker)
            protocol = rpc_protocol(sources / "vendor" / "llama.cpp" / RPC_HEADER)
        for tool in self.tools:
            program = self.build_dir / "bin" / program_name(tool)
            if not program.is_file():
                raise LibsError(f"the build produced no {program.name} in {program.parent}")
            files.append(program)
        staging = self.target.with_name(self.processor + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for path in files:
            shutil.copy2(path, staging / path.name, follow_symlinks=False)
        manifest = Manifest(
            processor=self.processor,
            llama_cpp_python=self.version,
            cmake_args=self.cmake_args,
            platform=f"{sys.platform}-{platform.machine()}",
            built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            rpc_protocol=protocol,
        )
        (staging / MANIFEST).write_text(json.dumps(asdict(manifest), indent=1))
        old = self.target.with_name(self.processor + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if self.target.exists():
            self.target.replace(old)
        staging.replace(self.target)
        shutil.rmtree(old, ignore_errors=True)
        remember_processor(self.root, self.processor)
