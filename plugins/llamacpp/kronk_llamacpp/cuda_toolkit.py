"""A CUDA 12 toolkit put together from packages, for building llama.cpp's CUDA libraries on a
machine with no GPU and no CUDA install (`kronk libs --processor cuda --cuda-toolkit download`).

PyPI's CUDA 12 wheels hold the headers, the runtime, cuBLAS, ptxas, libnvvm and libdevice,
but on Linux not the compiler driver: `nvidia-cuda-nvcc-cu12` ships ptxas alone (checked for
12.4 to 12.9). The driver and its helpers (nvcc, cicc, cudafe++, fatbinary, nvlink) come from
Debian's non-free `nvidia-cuda-toolkit` package of the same release, NVIDIA's own binaries,
unpacked rather than installed. The result has the layout of NVIDIA's installer, so CMake's
FindCUDAToolkit and nvcc find everything, plus three stand-ins a GPU-less build host lacks:

- `lib64/stubs/libcuda.so`: every `cu*` symbol of cuda.h, soname libcuda.so.1, so that
  ggml-cuda links the driver by soname; the GPU host's real driver is what loads.
- `lib64/libcudadevrt.a`: empty; nvcc always names it, and only relocatable device code
  (which llama.cpp does not use) needs it.
- `lib64/libcudart_static.a`: a linker script naming the shared runtime, so that every link,
  CMake's own compiler checks included, takes libcudart.so.12 by soname.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

RELEASE = "12.4.131"
# The PyPI wheels of that release: (distribution, version, folder under nvidia/).
WHEELS = (
    ("nvidia-cuda-nvcc-cu12", "12.4.131", "cuda_nvcc"),
    ("nvidia-cuda-runtime-cu12", "12.4.127", "cuda_runtime"),
    ("nvidia-cublas-cu12", "12.4.5.8", "cublas"),
    # 12.4.127 itself was yanked as broken.
    ("nvidia-cuda-cccl-cu12", "12.4.127.post1", "cuda_cccl"),
)


@dataclass(frozen=True, slots=True)
class DebianPackage:
    name: str
    pool_path: str
    sha256: str

    def urls(self) -> list[str]:
        return [
            f"https://deb.debian.org/debian/{self.pool_path}",
            f"http://deb.debian.org/debian/{self.pool_path}",
        ]


COMPILER = DebianPackage(
    "nvidia-cuda-toolkit",
    "pool/non-free/n/nvidia-cuda-toolkit/nvidia-cuda-toolkit_12.4.131~12.4.1-2_amd64.deb",
    "cd5fe85aee38d108b315f408a688641478f2402622a10c677478eb7a6c4e5319",
)
# From the Debian package: where each program lies in it.
PROGRAMS = {
    "bin/nvcc": "usr/lib/nvidia-cuda-toolkit/bin/nvcc",
    "nvvm/bin/cicc": "usr/lib/nvidia-cuda-toolkit/bin/cicc",
    "bin/cudafe++": "usr/bin/cudafe++",
    "bin/fatbinary": "usr/bin/fatbinary",
    "bin/nvlink": "usr/bin/nvlink",
    "bin/bin2c": "usr/bin/bin2c",
    "bin/cuobjdump": "usr/bin/cuobjdump",
    "bin/crt/link.stub": "usr/lib/nvidia-cuda-toolkit/bin/crt/link.stub",
    "bin/crt/prelink.stub": "usr/lib/nvidia-cuda-toolkit/bin/crt/prelink.stub",
}
# nvcc's own profile, as NVIDIA's installer writes it for a toolkit in one folder.
NVCC_PROFILE = """\
TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64/stubs" "-L$(TOP)/lib64"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
"""
MARKER = "kronk-cuda-toolkit.json"


class ToolkitError(Exception):
    """What stops putting the toolkit together: a download, a checksum, a missing file."""


def driver_stub_source(cuda_h: str) -> str:
    """C source of a stand-in libcuda: each driver function cuda.h declares or maps a name to
    (`#define cuMemAlloc cuMemAlloc_v2`: the _v2 symbol is what objects reference)."""
    declared = set(re.findall(r"\b(cu[A-Z]\w*)\s*\(", cuda_h))
    mapped = set(re.findall(r"#define\s+cu\w+\s+(cu[A-Z]\w*)", cuda_h))
    return "".join(f"int {name}(void) {{ return 999; }}\n" for name in sorted(declared | mapped))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as opened:
        for block in iter(lambda: opened.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fetch_debian(package: DebianPackage, into: Path, say: Callable[[str], None]) -> Path:
    target = into / Path(package.pool_path).name
    if target.is_file() and _sha256(target) == package.sha256:
        return target
    into.mkdir(parents=True, exist_ok=True)
    errors = []
    for url in package.urls():
        say(f"downloading {package.name} (Debian non-free) from {url}")
        partial = target.with_suffix(".partial")
        try:
            with urllib.request.urlopen(url, timeout=120) as response, partial.open("wb") as out:
                shutil.copyfileobj(response, out, 1 << 20)
        except OSError as exc:
            errors.append(f"{url}: {exc}")
            continue
        if _sha256(partial) != package.sha256:
            errors.append(f"{url}: the SHA-256 is not {package.sha256}")
            partial.unlink()
            continue
        partial.replace(target)
        return target
    raise ToolkitError(f"could not download {package.name}:\n  " + "\n  ".join(errors))


def _fetch_wheels(into: Path, say: Callable[[str], None]) -> list[Path]:
    into.mkdir(parents=True, exist_ok=True)
    wanted = [f"{name}=={pinned}" for name, pinned, _ in WHEELS]
    say(f"downloading the CUDA {RELEASE} wheels from PyPI: {', '.join(wanted)}")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(into), *wanted]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ToolkitError(f"pip could not download {wanted}: {done.stderr.strip()[-800:]}")
    wheels = []
    for name, pinned, _ in WHEELS:
        stem = name.replace("-", "_") + "-" + pinned + "-"
        found = sorted(into.glob(stem + "*.whl"))
        if not found:
            raise ToolkitError(f"pip downloaded no {name} {pinned} wheel into {into}")
        wheels.append(found[0])
    return wheels


def _unpack_debian(archive: Path, into: Path) -> None:
    """dpkg-deb where Debian has it; else ar and tar (the data member is data.tar.xz)."""
    into.mkdir(parents=True, exist_ok=True)
    if shutil.which("dpkg-deb"):
        subprocess.run(["dpkg-deb", "-x", str(archive), str(into)], check=True)
        return
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(["ar", "x", str(archive.resolve())], cwd=scratch, check=True)
        data = next(Path(scratch).glob("data.tar.*"))
        subprocess.run(["tar", "-xf", str(data), "-C", str(into)], check=True)


def toolkit_complete(root: Path) -> bool:
    try:
        return json.loads((root / MARKER).read_text()).get("release") == RELEASE
    except (OSError, ValueError):
        return False


def download_toolkit(cache: Path, say: Callable[[str], None] = print) -> Path:
    """The toolkit in `cache/cuda-<release>` (put together once; about 700 MB), its root."""
    root = cache / f"cuda-{RELEASE}"
    if toolkit_complete(root):
        return root
    if sys.platform != "linux":
        raise ToolkitError("the downloaded CUDA toolkit is for Linux x86-64 only")
    wheels = _fetch_wheels(cache / "downloads", say)
    deb = _fetch_debian(COMPILER, cache / "downloads", say)
    staging = root.with_name(root.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    say(f"putting the CUDA {RELEASE} toolkit together in {root}")
    unpacked = staging / "unpacked"
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as opened:
            opened.extractall(unpacked / "wheels")
    _unpack_debian(deb, unpacked / "deb")
    nvidia = unpacked / "wheels" / "nvidia"
    for _, _, folder in WHEELS:
        shutil.copytree(nvidia / folder / "include", staging / "include", dirs_exist_ok=True)
    (staging / "include" / "__init__.py").unlink(missing_ok=True)
    nvcc = nvidia / "cuda_nvcc"
    for place, source in {
        "bin/ptxas": nvcc / "bin" / "ptxas",
        "nvvm/lib64/libnvvm.so": nvcc / "nvvm" / "lib64" / "libnvvm.so",
        "nvvm/libdevice/libdevice.10.bc": nvcc / "nvvm" / "libdevice" / "libdevice.10.bc",
        **{place: unpacked / "deb" / inside for place, inside in PROGRAMS.items()},
    }.items():
        if not source.is_file():
            raise ToolkitError(f"{source.name} is missing from the CUDA packages ({source})")
        (staging / place).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, staging / place)
        if place.startswith(("bin/", "nvvm/bin/")) and "/crt/" not in place:
            # A wheel's zip keeps no modes; a ptxas nvcc cannot run sends it down PATH.
            (staging / place).chmod(0o755)
    (staging / "bin" / "nvcc.profile").write_text(NVCC_PROFILE)
    lib64 = staging / "lib64"
    (lib64 / "stubs").mkdir(parents=True)
    for folder, name in (
        ("cuda_runtime", "libcudart.so"),
        ("cublas", "libcublas.so"),
        ("cublas", "libcublasLt.so"),
    ):
        shutil.copy2(nvidia / folder / "lib" / f"{name}.12", lib64 / f"{name}.12")
        (lib64 / name).symlink_to(f"{name}.12")
    stub = unpacked / "libcuda.c"
    stub.write_text(driver_stub_source((staging / "include" / "cuda.h").read_text()))
    compiler = shutil.which("cc") or shutil.which("gcc") or "cc"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-w", "-Wl,-soname,libcuda.so.1",
         "-o", str(lib64 / "stubs" / "libcuda.so"), str(stub)],
        check=True,
    )  # fmt: skip
    subprocess.run(["ar", "rcs", str(lib64 / "libcudadevrt.a")], check=True)
    (lib64 / "libcudart_static.a").write_text("INPUT(-lcudart)\n")
    shutil.rmtree(unpacked)
    sources = [f"{name}=={pinned}" for name, pinned, _ in WHEELS] + [COMPILER.pool_path]
    (staging / MARKER).write_text(json.dumps({"release": RELEASE, "from": sources}, indent=1))
    shutil.rmtree(root, ignore_errors=True)
    staging.replace(root)
    return root


def cmake_arguments(root: Path) -> list[str]:
    """How CMake builds with the toolkit at `root`: its nvcc, its libraries, and the shared
    runtime (there is no static one in it)."""
    return [
        f"-DCMAKE_CUDA_COMPILER={root / 'bin' / 'nvcc'}",
        f"-DCUDAToolkit_ROOT={root}",
        "-DCMAKE_CUDA_RUNTIME_LIBRARY=Shared",
    ]
