"""A CUDA toolkit put together from packages, for building llama.cpp's CUDA libraries on a
machine with no GPU and no CUDA install (`kronk libs --processor cuda --cuda-toolkit 13`).

- CUDA 13 (drivers 580 and later): PyPI's wheels (nvcc, nvvm, crt, runtime, cuBLAS, CCCL)
  unpack into one toolkit tree, `nvidia/cu13`, as NVIDIA lays them out.
- CUDA 12 (drivers 525 and later): PyPI's CUDA 12 wheels hold the headers, the runtime,
  cuBLAS, ptxas, libnvvm and libdevice, but on Linux not the compiler driver
  (`nvidia-cuda-nvcc-cu12` ships ptxas alone, 12.4 to 12.9). nvcc, cicc, cudafe++, fatbinary
  and nvlink come from Debian's non-free `nvidia-cuda-toolkit` of the same release, NVIDIA's
  own binaries, unpacked rather than installed, into the layout of NVIDIA's installer.
  Two stand-ins complete it: an empty `libcudadevrt.a` and a `libcudart_static.a` that
  names the shared runtime (below).

Either way CMake's FindCUDAToolkit and nvcc find everything, and a stand-in for the driver,
which only a GPU host has, lets ggml-cuda link it by soname: `lib64/stubs/libcuda.so`, every
`cu*` function cuda.h names, soname libcuda.so.1. What loads on the GPU host is its driver.
"""

from __future__ import annotations

import hashlib
import json
import platform
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


@dataclass(frozen=True, slots=True)
class Release:
    """One CUDA release the toolkit can be put together for."""

    major: str
    version: str
    wheels: tuple[str, ...]  # PyPI requirements, pinned
    # CUDA 12 only: the compiler driver from Debian (PyPI's CUDA 12 wheels lack it).
    compiler: DebianPackage | None = None


RELEASES = {
    # CUDA 13: PyPI's wheels are a whole toolkit in one tree (nvidia/cu13). Drivers 580+.
    "13": Release(
        "13",
        "13.0.88",
        (
            "nvidia-cuda-nvcc==13.0.88",
            "nvidia-nvvm==13.0.88",
            "nvidia-cuda-crt==13.0.88",
            "nvidia-cuda-runtime==13.0.96",
            "nvidia-cublas==13.0.2.14",
            "nvidia-cuda-cccl==13.0.85",
            # The first release PyPI has; it reads 13.0's code objects.
            "nvidia-cuda-cuobjdump==13.2.51",
        ),
    ),
    # CUDA 12: drivers 525+.
    "12": Release(
        "12",
        "12.4.131",
        (
            "nvidia-cuda-nvcc-cu12==12.4.131",
            "nvidia-cuda-runtime-cu12==12.4.127",
            "nvidia-cublas-cu12==12.4.5.8",
            "nvidia-cuda-cccl-cu12==12.4.127.post1",  # 12.4.127 itself was yanked as broken
        ),
        DebianPackage(
            "nvidia-cuda-toolkit",
            "pool/non-free/n/nvidia-cuda-toolkit/nvidia-cuda-toolkit_12.4.131~12.4.1-2_amd64.deb",
            "cd5fe85aee38d108b315f408a688641478f2402622a10c677478eb7a6c4e5319",
        ),
    ),
}
# CUDA 12's wheels, by folder under nvidia/, whose headers make the toolkit's include/.
CUDA12_FOLDERS = ("cuda_nvcc", "cuda_runtime", "cublas", "cuda_cccl")
# CUDA 12's programs from the Debian package: where each lies in it.
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


def _fetch_wheels(release: Release, into: Path, say: Callable[[str], None]) -> list[Path]:
    into.mkdir(parents=True, exist_ok=True)
    say(f"downloading the CUDA {release.version} wheels from PyPI: {', '.join(release.wheels)}")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(into)]
    done = subprocess.run([*command, *release.wheels], capture_output=True, text=True)
    if done.returncode != 0:
        raise ToolkitError(f"pip could not download the wheels: {done.stderr.strip()[-800:]}")
    wheels = []
    for requirement in release.wheels:
        name, pinned = requirement.split("==")
        found = sorted(into.glob(f"{name.replace('-', '_')}-{pinned}-*.whl"))
        if not found:
            raise ToolkitError(f"pip downloaded no {requirement} wheel into {into}")
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


def _lay_out_13(nvidia: Path, staging: Path) -> None:
    """CUDA 13's wheels already form one toolkit tree; its libraries are in lib/."""
    (nvidia / "cu13").replace(staging)
    (staging / "lib64").symlink_to("lib")


def _lay_out_12(nvidia: Path, deb: Path, staging: Path) -> None:
    for folder in CUDA12_FOLDERS:
        shutil.copytree(nvidia / folder / "include", staging / "include", dirs_exist_ok=True)
    (staging / "include" / "__init__.py").unlink(missing_ok=True)
    nvcc = nvidia / "cuda_nvcc"
    for place, source in {
        "bin/ptxas": nvcc / "bin" / "ptxas",
        "nvvm/lib64/libnvvm.so": nvcc / "nvvm" / "lib64" / "libnvvm.so",
        "nvvm/libdevice/libdevice.10.bc": nvcc / "nvvm" / "libdevice" / "libdevice.10.bc",
        **{place: deb / inside for place, inside in PROGRAMS.items()},
    }.items():
        if not source.is_file():
            raise ToolkitError(f"{source.name} is missing from the CUDA packages ({source})")
        (staging / place).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, staging / place)
    (staging / "bin" / "nvcc.profile").write_text(NVCC_PROFILE)
    lib64 = staging / "lib64"
    lib64.mkdir()
    for folder, name in (
        ("cuda_runtime", "libcudart.so.12"),
        ("cublas", "libcublas.so.12"),
        ("cublas", "libcublasLt.so.12"),
    ):
        shutil.copy2(nvidia / folder / "lib" / name, lib64 / name)
    # Not in the wheels: nvcc names the device runtime in every link (only relocatable
    # device code, which llama.cpp has none of, uses it), and CMake's compiler checks link
    # the static runtime, which this script points at the shared one.
    subprocess.run(["ar", "rcs", str(lib64 / "libcudadevrt.a")], check=True)
    (lib64 / "libcudart_static.a").write_text("INPUT(-lcudart)\n")


def toolkit_complete(root: Path, release: Release) -> bool:
    try:
        marker = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("version") == release.version


def download_toolkit(major: str, cache: Path, say: Callable[[str], None] = print) -> Path:
    """The CUDA `major` toolkit in `cache/cuda-<version>`, put together once, its root."""
    release = RELEASES[major]
    root = cache / f"cuda-{release.version}"
    if toolkit_complete(root, release):
        return root
    if sys.platform != "linux" or platform.machine() != "x86_64":
        raise ToolkitError("the downloaded CUDA toolkits are for Linux x86-64 only")
    downloads = cache / "downloads"
    wheels = _fetch_wheels(release, downloads, say)
    deb = None if release.compiler is None else _fetch_debian(release.compiler, downloads, say)
    staging = root.with_name(root.name + ".partial")
    unpacked = root.with_name(root.name + ".unpacked")
    for scratch in (staging, unpacked):
        shutil.rmtree(scratch, ignore_errors=True)
    say(f"putting the CUDA {release.version} toolkit together in {root}")
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as opened:
            opened.extractall(unpacked / "wheels")
    if deb is None:
        _lay_out_13(unpacked / "wheels" / "nvidia", staging)
    else:
        _unpack_debian(deb, unpacked / "deb")
        _lay_out_12(unpacked / "wheels" / "nvidia", unpacked / "deb", staging)
    for folder in ("bin", "nvvm/bin"):
        # A wheel's zip keeps no modes; a ptxas nvcc cannot run sends it down PATH.
        for program in (staging / folder).glob("*"):
            if program.is_file():
                program.chmod(0o755)
    lib64 = staging / "lib64"
    for name in ("libcudart.so", "libcublas.so", "libcublasLt.so"):
        (lib64 / name).symlink_to(f"{name}.{release.major}")
    stubs = lib64 / "stubs"
    stubs.mkdir(exist_ok=True)
    stub = unpacked / "libcuda.c"
    stub.write_text(driver_stub_source((staging / "include" / "cuda.h").read_text()))
    compiler = shutil.which("cc") or shutil.which("gcc") or "cc"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-w", "-Wl,-soname,libcuda.so.1",
         "-o", str(stubs / "libcuda.so"), str(stub)],
        check=True,
    )  # fmt: skip
    # Under its soname too: the linker looks for libcuda.so.1 by that name when a program
    # links a library that needs it.
    (stubs / "libcuda.so.1").symlink_to("libcuda.so")
    shutil.rmtree(unpacked)
    sources = [*release.wheels, *([release.compiler.pool_path] if release.compiler else [])]
    (staging / MARKER).write_text(
        json.dumps({"version": release.version, "from": sources}, indent=1)
    )
    shutil.rmtree(root, ignore_errors=True)
    staging.replace(root)
    return root


def cmake_arguments(root: Path) -> list[str]:
    """How CMake builds with the toolkit at `root`: its nvcc, its libraries, and the shared
    runtime. A program linking ggml-cuda's library must find what that library needs
    (cuBLAS, the driver) where the build embeds no path to them: -rpath-link, which names
    where to look at link time and leaves nothing in the result."""
    lib64 = root / "lib64"
    rpath_link = f"-Wl,-rpath-link,{lib64}:{lib64 / 'stubs'}"
    return [
        f"-DCMAKE_CUDA_COMPILER={root / 'bin' / 'nvcc'}",
        f"-DCUDAToolkit_ROOT={root}",
        "-DCMAKE_CUDA_RUNTIME_LIBRARY=Shared",
        f"-DCMAKE_EXE_LINKER_FLAGS={rpath_link}",
        f"-DCMAKE_SHARED_LINKER_FLAGS={rpath_link}",
    ]
