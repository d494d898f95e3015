"""llama.cpp for CUDA, built on this machine (no GPU, no CUDA install) for the GPU check.

Building llama.cpp for CUDA takes about 4 of a GPU host's 15 minutes; this builds it here
instead, once, with `kronk libs` (the path a user's GPU-less build host takes):

    kronk libs --processor cuda --cuda-toolkit 13 --cuda-arch 80-real,90-real \\
        --tool llama-server --tool llama-batched-bench --cmake-arg ... --lib-path CACHE

(A100 and H100/H200 code, flash attention off as the GPU kit builds it, a CPU part for any
AVX2 machine rather than this one; CUDA 13, which the GPU hosts run: docs/gpu.md), checks
the result (each architecture's code is in libggml-cuda, which takes the CUDA 13 runtime,
cuBLAS and the driver by soname and nothing by path), and packs it into
`.gpu-libs/llama-cuda.tar.xz` in the checkout, which bench/gpu/run.sh unpacks in place of
the kit's build. Two cores: about an hour the first
time; later runs find the build up to date.

    python bench/gpu/cuda_bundle.py [--lib-path DIR] [--out DIR] [--kit DIR | --keep-kit-source]

A device call carries at most 64 MiB: the kit's bundle (.gpu, made by its prepare.sh) keeps
llama.cpp's source for the build this replaces, 33 of its 43 MB, so the source goes (all but
models/, whose vocabulary the kit's model generator reads) unless --keep-kit-source.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from kronk_core.settings.model_files import cache_dir
from kronk_llamacpp.cuda_toolkit import RELEASES
from kronk_llamacpp.native import MANIFEST

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURES = ("80", "90")
TOOLS = ("llama-server", "llama-batched-bench")
CMAKE_ARGS = (
    "-DGGML_CUDA_FA=OFF",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
)
CUDA = "13"
NEEDED = {f"libcudart.so.{CUDA}", f"libcublas.so.{CUDA}", "libcuda.so.1"}
LIMIT_MB = 60


def build(lib_path: Path) -> Path:
    command = [
        sys.executable, "-m", "kronk_api.cli", "libs", "--processor", "cuda",
        "--cuda-toolkit", CUDA,
        "--cuda-arch", ",".join(f"{arch}-real" for arch in ARCHITECTURES),
        *(f"--tool={tool}" for tool in TOOLS),
        *(f"--cmake-arg={arg}" for arg in CMAKE_ARGS),
        "--lib-path", str(lib_path),
    ]  # fmt: skip
    print("$", " ".join(command[2:]), flush=True)
    subprocess.run(command, check=True)
    return lib_path / "cuda"


def check(installed: Path, lib_path: Path) -> list[str]:
    """What is wrong with the build, if anything (an empty list: nothing)."""
    problems = []
    cuobjdump = lib_path / "toolkits" / f"cuda-{RELEASES[CUDA].version}" / "bin" / "cuobjdump"
    library = installed / "libggml-cuda.so"
    listed = subprocess.run(
        [str(cuobjdump), "--list-elf", str(library)], capture_output=True, text=True, check=True
    ).stdout
    for arch in ARCHITECTURES:
        count = listed.count(f".sm_{arch}.cubin")
        print(f"{library.name}: {count} sm_{arch} code objects")
        if count == 0:
            problems.append(f"no sm_{arch} code in {library.name}")
    for path in sorted(installed.iterdir()):
        if path.is_symlink() or not (path.name.startswith("lib") or path.name in TOOLS):
            continue
        dynamic = subprocess.run(
            ["readelf", "-d", str(path)], capture_output=True, text=True, check=True
        ).stdout
        needed = re.findall(r"Shared library: \[(.*?)\]", dynamic)
        paths = re.findall(r"R(?:UN)?PATH\).*\[(.*?)\]", dynamic)
        print(f"{path.name}: needs {' '.join(needed)}; search path {paths or 'none'}")
        if any(entry != "$ORIGIN" for entry in paths):
            problems.append(f"{path.name} searches {paths}: only $ORIGIN may be named")
        if path.name == library.name and not set(needed) >= NEEDED:
            problems.append(f"{library.name} needs {needed}, not all of {sorted(NEEDED)}")
    return problems


def pack(installed: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    archive = out / "llama-cuda.tar.xz"
    with tarfile.open(archive, "w:xz", preset=6) as packed:
        for path in sorted(installed.iterdir()):
            packed.add(path, arcname=path.name)
    return archive


def trim_kit(kit: Path) -> None:
    """The kit's copy of llama.cpp's source, but for the models/ folder."""
    source = kit / "llama.cpp"
    for path in sorted(source.iterdir()) if source.is_dir() else ():
        if path.name != "models":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    print(f"{source}: source removed (models/ kept); the kit reuses the bundle instead")


def megabytes(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lib-path", type=Path, default=cache_dir() / "gpu-bundle")
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu-libs")
    parser.add_argument("--kit", type=Path, default=ROOT / ".gpu", help="the kit's bundle")
    parser.add_argument("--keep-kit-source", action="store_true")
    args = parser.parse_args()
    installed = build(args.lib_path)
    problems = check(installed, args.lib_path)
    if problems:
        print("\n".join(["the build is not what the GPU check needs:", *problems]))
        return 1
    archive = pack(installed, args.out)
    size = archive.stat().st_size / 1e6
    manifest = json.loads((installed / MANIFEST).read_text())
    print(f"{archive}: {size:.1f} MB (llama-cpp-python {manifest['llama_cpp_python']})")
    if size > LIMIT_MB:
        print(f"over the {LIMIT_MB} MB a GPU call can carry")
        return 1
    if args.kit.is_dir():
        if not args.keep_kit_source:
            trim_kit(args.kit)
        tracked = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout.split(b"\0")
        checkout = sum((ROOT / os.fsdecode(name)).stat().st_size for name in tracked if name)
        total = checkout / 2**20 + megabytes(args.kit) + megabytes(args.out)
        print(f"a device call carrying {args.kit.name} and {args.out.name} sends about "
              f"{total:.0f} MiB (the limit is 64)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
