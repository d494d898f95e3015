"""`kronk libs`: a real CPU build from the pinned llama-cpp-python sdist, installed and used.

The build is the one the tests share (kronk_testing.libs_build: with the RPC backend, which
test_rpc.py needs too), kept in ~/.cache/kronk/libs: a later run finds it up to date.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from kronk_core.settings.model_files import cache_dir
from kronk_llamacpp.cuda_toolkit import cmake_arguments as cuda_cmake_arguments
from kronk_llamacpp.cuda_toolkit import download_toolkit, driver_stub_source
from kronk_llamacpp.detect import Detected, detect
from kronk_llamacpp.libs import BuildProgress, LibsBuilder, LibsError, missing_tools, worker_name
from kronk_llamacpp.native import MANIFEST
from kronk_llamacpp.packaged import default_model_path
from kronk_testing.libs_build import BUILD, LIBS, USE_IT, kronk

USE_THEM = """
import asyncio
from pathlib import Path
from kronk_core import Kronk
kronk = Kronk()
result = asyncio.run(kronk.chat([{"role": "user", "content": "Hi"}], max_tokens=4))
from kronk_llamacpp import native
print("tokens", result.usage.completion_tokens)
print("directory", native.load().directory)
maps = Path("/proc/self/maps").read_text().splitlines()
print("mapped", ",".join(sorted({line.split()[-1] for line in maps if "libllama" in line})))
kronk.close()
"""


def test_a_missing_toolchain_is_a_clear_error_before_any_download(tmp_path: Path) -> None:
    bare = {"PATH": str(tmp_path), "VULKAN_SDK": str(tmp_path)}
    vulkan = kronk("libs", "--processor", "vulkan", "--lib-path", str(tmp_path), env=bare)
    assert vulkan.returncode == 1
    assert "cannot build the vulkan libraries; missing:" in vulkan.stderr
    assert "glslc" in vulkan.stderr and "cmake" in vulkan.stderr
    metal = kronk("libs", "--processor", "metal", "--lib-path", str(tmp_path))
    assert metal.returncode == 1 and "Metal libraries build only on a Mac" in metal.stderr
    assert not (tmp_path / "src").exists()


def test_cpu_libraries_build_install_and_serve() -> None:
    built = kronk(*BUILD)
    assert built.returncode == 0, built.stdout + built.stderr
    assert f"kronk loads them from now on (KRONK_LIB_PATH={LIBS} kronk server start)" in (
        built.stdout
    )
    if "up to date" not in built.stdout:  # a build (CI's fresh machine) says how far it is
        assert "building the cpu libraries: 100%" in built.stdout
    manifest = json.loads((LIBS / "cpu" / MANIFEST).read_text())
    assert manifest["processor"] == "cpu"
    assert manifest["llama_cpp_python"] == version("llama-cpp-python")
    assert "-DBUILD_SHARED_LIBS=ON" in manifest["cmake_args"]
    assert "-DGGML_RPC=ON" in manifest["cmake_args"]
    assert manifest["rpc_protocol"].count(".") == 2  # read from the source's ggml-rpc.h
    assert (LIBS / "cpu" / worker_name()).is_file()
    assert f"RPC worker: {LIBS / 'cpu' / worker_name()}" in built.stdout
    # The tool runs from the install, on the libraries beside it ($ORIGIN).
    bench = LIBS / "cpu" / "llama-batched-bench"
    assert f"llama-batched-bench: {bench}" in built.stdout
    ran = subprocess.run(
        # -nr: no weight repacking, whose AMX kernels crash where a CPU reports AMX.
        [str(bench), "-m", str(default_model_path()), "-c", "256", "-npp", "16", "-ntg", "4",
         "-npl", "1", "-t", "1", "-nr", "--output-format", "jsonl"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    rows = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    assert [(row["pl"], row["tg"]) for row in rows] == [(1, 4)] and rows[0]["speed_tg"] > 0
    loaded = subprocess.run(["ldd", str(bench)], capture_output=True, text=True).stdout
    assert f"{LIBS / 'cpu'}/libllama.so" in loaded

    again = kronk(*BUILD)
    assert again.returncode == 0 and "up to date" in again.stdout

    used = subprocess.run(
        [sys.executable, "-c", USE_THEM],
        capture_output=True,
        text=True,
        env={**os.environ, **USE_IT},
        timeout=600,
    )
    assert used.returncode == 0, used.stderr
    lines = dict(line.split(" ", 1) for line in used.stdout.splitlines())
    assert int(lines["tokens"]) > 0
    assert Path(lines["directory"]) == LIBS / "cpu"
    mapped = lines["mapped"].split(",")
    assert mapped and all(path.startswith(f"{LIBS / 'cpu'}/") for path in mapped)

    # Remembered: without KRONK_PROCESSOR, Kronk loads what `kronk libs` installed there.
    remembered = subprocess.run(
        [sys.executable, "-c", USE_THEM],
        capture_output=True,
        text=True,
        env={**os.environ, "KRONK_LIB_PATH": str(LIBS)},
        timeout=600,
    )
    assert remembered.returncode == 0, remembered.stderr
    lines = dict(line.split(" ", 1) for line in remembered.stdout.splitlines())
    assert Path(lines["directory"]) == LIBS / "cpu"


def test_a_processor_without_libraries_is_refused_with_the_command_to_run(tmp_path: Path) -> None:
    refused = subprocess.run(
        [sys.executable, "-c", USE_THEM],
        capture_output=True,
        text=True,
        env={**os.environ, "KRONK_PROCESSOR": "cuda", "KRONK_LIB_PATH": str(tmp_path)},
        timeout=600,
    )
    assert refused.returncode != 0
    assert f"no cuda llama.cpp libraries in {tmp_path / 'cuda'}" in refused.stderr
    assert "kronk libs --processor cuda" in refused.stderr


def fake_tool(directory: Path, name: str, output: str) -> None:
    """A vendor's GPU tool as it answers on a machine with that GPU (none exists here)."""
    script = directory / name
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' {shlex.quote(output)}\n")  # a shell builtin
    script.chmod(0o755)


NVIDIA_SMI = "NVIDIA H100 80GB HBM3, 9.0\nNVIDIA GeForce RTX 4090, 8.9"
ROCMINFO = """Agent 2
  Name:                    gfx90a
  Marketing Name:          AMD Instinct MI210"""
VULKANINFO = """GPU0:
	deviceType         = PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU
	deviceName         = Intel(R) Graphics (ADL GT2)"""


@pytest.mark.parametrize(
    ("tool", "output", "processor", "found", "cmake_args"),
    [
        ("nvidia-smi", NVIDIA_SMI, "cuda",
         "NVIDIA H100 80GB HBM3 (compute capability 9.0), NVIDIA GeForce RTX 4090 "
         "(compute capability 8.9)", ("-DCMAKE_CUDA_ARCHITECTURES=89;90",)),
        ("rocminfo", ROCMINFO, "hip", "AMD GPU (gfx90a)", ("-DAMDGPU_TARGETS=gfx90a",)),
        ("vulkaninfo", VULKANINFO, "vulkan", "Vulkan GPU (Intel(R) Graphics (ADL GT2))", ()),
    ],
)  # fmt: skip
def test_the_gpu_is_detected_by_its_vendors_tool(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tool: str,
    output: str,
    processor: str,
    found: str,
    cmake_args: tuple[str, ...],
) -> None:
    fake_tool(tmp_path, tool, output)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect() == Detected(processor, found, cmake_args)


def test_no_gpu_tool_means_the_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tool(tmp_path, "nvidia-smi", "No devices were found")  # a driver without a GPU
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect().processor == "cpu"


def test_kronk_libs_builds_for_the_detected_gpu(tmp_path: Path) -> None:
    """Auto-detection picks CUDA for its architectures; without nvcc it says what to install
    before downloading anything."""
    fake_tool(tmp_path, "nvidia-smi", NVIDIA_SMI)
    fake_tool(tmp_path, "cmake", "cmake version 3.30")
    fake_tool(tmp_path, "g++", "")
    done = kronk("libs", "--lib-path", str(tmp_path / "libs"), env={"PATH": str(tmp_path)})
    assert done.returncode == 1
    assert "detected: cuda: NVIDIA H100 80GB HBM3 (compute capability 9.0)" in done.stdout
    assert "cannot build the cuda libraries; missing:" in done.stderr and "nvcc" in done.stderr
    assert not (tmp_path / "libs" / "src").exists()


def test_build_progress_is_read_from_ninja_and_make() -> None:
    said: list[str] = []
    ninja = BuildProgress(said.append, "cuda")
    for done in range(1, 41):
        ninja.read(f"[{done}/40] Building CUDA object ggml/src/x{done}.cu.o\n")
    assert said[0] == "building the cuda libraries: 10% (4/40)"
    assert said[-1] == "building the cuda libraries: 100% (40/40)" and len(said) == 10
    said.clear()
    make = BuildProgress(said.append, "cpu")
    for line in ("[  3%] Building C object a.o", "-- configured", "[ 12%] Linking", "[100%] Built"):
        make.read(line)
    assert said == ["building the cpu libraries: 12%", "building the cpu libraries: 100%"]


def test_a_cuda_build_without_a_gpu_must_name_its_architectures(tmp_path: Path) -> None:
    """CUDA's default architectures are the GPUs found at build time: on a build host without
    one, the command says to name them, before anything is downloaded."""
    bare = {"PATH": os.environ["PATH"], "KRONK_PROCESSOR": ""}
    done = kronk("libs", "--processor", "cuda", "--lib-path", str(tmp_path), env=bare)
    assert done.returncode == 2
    assert "no NVIDIA GPU found here to build for" in done.stderr and "--cuda-arch" in done.stderr
    cpu = kronk("libs", "--processor", "cpu", "--cuda-arch", "90", "--lib-path", str(tmp_path))
    assert cpu.returncode == 2 and "are for --processor cuda" in cpu.stderr
    assert not any(tmp_path.iterdir())


def test_cmake_arguments_name_the_tools_and_the_toolkit(tmp_path: Path) -> None:
    builder = LibsBuilder(
        "cuda", tmp_path, tools=("llama-server", "llama-batched-bench"), cuda_toolkit=tmp_path
    )
    args = builder.cmake_args
    assert "-DLLAMA_BUILD_SERVER=ON" in args and "-DLLAMA_BUILD_SERVER=OFF" not in args
    assert "-DLLAMA_BUILD_TOOLS=ON" in args and "-DLLAMA_BUILD_COMMON=ON" in args
    assert f"-DCMAKE_CUDA_COMPILER={tmp_path / 'bin' / 'nvcc'}" in args
    assert "-DCMAKE_CUDA_RUNTIME_LIBRARY=Shared" in args
    # The toolkit stands for an installed one: no nvcc on PATH is missing.
    assert not any("nvcc" in missing for missing in missing_tools("cuda", cuda_toolkit=tmp_path))
    with pytest.raises(LibsError, match="unknown tools"):
        LibsBuilder("cpu", tmp_path, tools=("rm",))
    with pytest.raises(LibsError, match="a CUDA toolkit was given for a cpu build"):
        LibsBuilder("cpu", tmp_path, cuda_toolkit=tmp_path)


def test_the_driver_stub_exports_what_cuda_h_names(tmp_path: Path) -> None:
    """libcuda's stand-in has the functions cuda.h declares and the versioned names its macros
    map to (objects reference cuMemAlloc_v2, not cuMemAlloc), under the driver's soname."""
    header = (
        "CUresult CUDAAPI cuInit(unsigned int Flags);\n"
        "#define cuMemAlloc cuMemAlloc_v2\n"
        "CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize);\n"
    )
    source = tmp_path / "stub.c"
    source.write_text(driver_stub_source(header))
    library = tmp_path / "libcuda.so"
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(library), str(source)],
        check=True,
    )
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert {"cuInit", "cuMemAlloc_v2"} <= set(symbols)
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True)
    assert "Library soname: [libcuda.so.1]" in dynamic.stdout


CUDA_KERNEL = """
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_fp16.h>
#include <cub/cub.cuh>
__global__ void twice(half *x) { x[threadIdx.x] = __hadd(x[threadIdx.x], x[threadIdx.x]); }
extern "C" int run(void) {
    half *p;
    cublasHandle_t handle;
    CUdevice device;
    cuDeviceGet(&device, 0);
    cublasCreate(&handle);
    cudaMalloc(&p, 64);
    twice<<<1, 32>>>(p);
    return 0;
}
"""

CUDA_PROJECT = """
cmake_minimum_required(VERSION 3.18)
project(probe LANGUAGES CXX CUDA)
find_package(CUDAToolkit REQUIRED)
add_library(probe SHARED probe.cu)
target_link_libraries(probe PRIVATE CUDA::cudart CUDA::cublas CUDA::cuda_driver)
add_executable(main main.cpp)
target_link_libraries(main PRIVATE probe)
"""


@pytest.mark.parametrize("major", ["13", "12"])
def test_a_downloaded_cuda_toolkit_builds_for_two_architectures(tmp_path: Path, major: str) -> None:
    """The toolkit put together from packages (kept in the cache) builds a CMake CUDA library
    as llama.cpp's is built, and a program on it as llama.cpp's tools are: code for sm_80 and
    sm_90 in the library, the release's runtime and cuBLAS and the driver linked by soname,
    and no path into the toolkit."""
    root = download_toolkit(major, cache_dir() / "cuda-toolkit")
    (tmp_path / "probe.cu").write_text(CUDA_KERNEL)
    (tmp_path / "main.cpp").write_text('extern "C" int run(void);\nint main() { return run(); }\n')
    (tmp_path / "CMakeLists.txt").write_text(CUDA_PROJECT)
    build = tmp_path / "build"
    configure = [
        "cmake", "-S", str(tmp_path), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
        "-DCMAKE_CUDA_ARCHITECTURES=80-real;90-real", "-DCMAKE_SKIP_RPATH=ON",
        *cuda_cmake_arguments(root),
    ]  # fmt: skip
    for command in (configure, ["cmake", "--build", str(build)]):
        done = subprocess.run(command, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    library = build / "libprobe.so"
    listed = subprocess.run(
        [str(root / "bin" / "cuobjdump"), "--list-elf", str(library)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert ".sm_80.cubin" in listed and ".sm_90.cubin" in listed
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True)
    needed = set(re.findall(r"Shared library: \[(.*?)\]", dynamic.stdout))
    wanted = {f"libcudart.so.{major}", f"libcublas.so.{major}", "libcuda.so.1"}
    assert wanted <= needed
    assert "PATH" not in dynamic.stdout
    program = subprocess.run(["readelf", "-d", str(build / "main")], capture_output=True, text=True)
    assert "libprobe.so" in program.stdout and "PATH" not in program.stdout
