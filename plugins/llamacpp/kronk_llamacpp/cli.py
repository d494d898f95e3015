"""The llamacpp plugin's commands: `kronk libs`, `kronk rpc start`."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click

from kronk_api.contract import BoolValueGroup, add_server_start_option
from kronk_api.contract import listen as listen_socket
from kronk_core.contract import ConfigError, KronkError
from kronk_llamacpp import native
from kronk_llamacpp.cuda_toolkit import RELEASES, ToolkitError, download_toolkit
from kronk_llamacpp.detect import detect
from kronk_llamacpp.endpoint import Endpoint
from kronk_llamacpp.libs import TOOLS, LibsBuilder, LibsError, program_name, worker_name
from kronk_llamacpp.native import PROCESSORS, libraries_root
from kronk_llamacpp.worker import worker_command

# CMake variables naming the GPU architectures to build for: detected ones go in unless
# the user names their own.
_ARCHITECTURE_VARIABLES = ("CMAKE_CUDA_ARCHITECTURES", "AMDGPU_TARGETS")


def _select_processor(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """Load the processor's libraries in place of those the variables chose, or stop the
    start in one line naming the `kronk libs` command that installs them."""
    if value is not None:
        try:
            native.select(value.lower(), source="--processor")
        except ConfigError as exc:
            raise click.ClickException(exc.message) from None


def _llama_log(ctx: click.Context, param: click.Parameter, value: bool | None) -> None:
    """--llama-log=0 hides llama.cpp's own log lines below error level."""
    if value is not None:
        os.environ["KRONK_LLAMA_LOG"] = "1" if value else "0"
        logging.getLogger("kronk.llama").setLevel(logging.NOTSET if value else logging.ERROR)


# The Kronk manual's runtime flags of `kronk server start`. --processor and --lib-path
# set their variables before the plugins load (importing this one binds libllama);
# --processor's callback then says whether those libraries are the ones loaded.
SERVER_START_OPTIONS = (
    click.Option(
        ["--lib-path"],
        envvar="KRONK_LIB_PATH",
        type=click.Path(path_type=Path),
        expose_value=False,  # read before the plugins load (kronk_api.cli.group.EARLY_VARIABLES)
        help="Where `kronk libs` installed llama.cpp's libraries [~/.kronk/libraries] "
        "(env KRONK_LIB_PATH)",
    ),
    click.Option(
        ["--processor"],
        type=click.Choice(PROCESSORS, case_sensitive=False),
        expose_value=False,
        callback=_select_processor,
        help="Load the llama.cpp libraries `kronk libs --processor X` built for this processor "
        "(env KRONK_PROCESSOR)",
    ),
    click.Option(
        ["--llama-log"],
        type=click.BOOL,
        envvar="KRONK_LLAMA_LOG",
        expose_value=False,
        callback=_llama_log,
        metavar="1|0",
        help="llama.cpp's own log lines: 1 shows them, 0 only its errors [1] (env KRONK_LLAMA_LOG)",
    ),
)


@click.command("libs")
@click.option(
    "--processor",
    envvar="KRONK_PROCESSOR",
    type=click.Choice(("auto", *PROCESSORS), case_sensitive=False),
    default="auto",
    show_default=True,
    help="Which llama.cpp backend to build (auto: the GPU this machine has, else cpu)",
)
@click.option(
    "--lib-path",
    envvar="KRONK_LIB_PATH",
    type=click.Path(path_type=Path),
    help="Where libraries are installed [~/.kronk/libraries]",
)
@click.option(
    "--source",
    envvar="KRONK_LIBS_SOURCE",
    type=click.Path(exists=True, path_type=Path),
    help="The llama-cpp-python sdist (.tar.gz or unpacked folder) instead of downloading it",
)
@click.option("--jobs", "-j", type=int, envvar="KRONK_LIBS_JOBS", help="Parallel jobs [cores]")
@click.option(
    "--cmake-arg",
    "cmake_args",
    multiple=True,
    help="Extra CMake argument, repeatable (e.g. -DCMAKE_CUDA_ARCHITECTURES=90)",
)
@click.option(
    "--rpc",
    is_flag=True,
    envvar="KRONK_LIBS_RPC",
    help="Also build llama.cpp's RPC backend and its worker, ggml-rpc-server (models split "
    "over rpc_servers; kronk rpc start)",
)
@click.option(
    "--cuda-arch",
    "cuda_architectures",
    help="CUDA architectures to build for, comma-separated CMake spellings (90: H100/H200, "
    "80: A100, 89: RTX 40xx; 90-real: without PTX) [the GPUs found here]",
)
@click.option(
    "--cuda-toolkit",
    type=click.Choice(("system", *RELEASES)),
    default="system",
    show_default=True,
    help="The CUDA toolkit a cuda build compiles with: the one installed here, or CUDA 13 "
    "(for drivers 580+; PyPI's wheels) or 12 (drivers 525+; PyPI's wheels and Debian's "
    "compiler package) put together under the library path (Linux x86-64, about 1 GB)",
)
@click.option(
    "--tool",
    "tools",
    multiple=True,
    type=click.Choice(TOOLS),
    help="Also build and install this program of llama.cpp's from the same build, repeatable",
)
@click.option("--force", is_flag=True, help="Rebuild even when the installed build matches")
@click.option(
    "--local",
    is_flag=True,
    help="Build on this machine (the Kronk manual's flag; Kronk always builds locally)",
)
def libs(
    processor: str,
    lib_path: Path | None,
    source: Path | None,
    jobs: int | None,
    cmake_args: tuple[str, ...],
    rpc: bool,
    cuda_architectures: str | None,
    cuda_toolkit: str,
    tools: tuple[str, ...],
    force: bool,
    local: bool,
) -> None:
    """Build and install llama.cpp's libraries for this machine's processor (or the one
    named: cpu, cuda, hip, vulkan, metal); later runs of Kronk load them."""
    root = (lib_path or libraries_root()).expanduser()
    processor = processor.lower()
    detected = detect()
    if processor == "auto":
        processor = detected.processor
        click.echo(f"detected: {detected.processor}: {detected.found}")
    if (cuda_architectures or cuda_toolkit != "system") and processor != "cuda":
        raise click.UsageError("--cuda-arch and --cuda-toolkit are for --processor cuda")
    if cuda_architectures:
        listed = ";".join(part.strip() for part in cuda_architectures.split(",") if part)
        cmake_args = (f"-DCMAKE_CUDA_ARCHITECTURES={listed}", *cmake_args)
    named = {arg.removeprefix("-D").split("=")[0].split(":")[0] for arg in cmake_args}
    if detected.processor == processor and not named & set(_ARCHITECTURE_VARIABLES):
        cmake_args = (*detected.cmake_args, *cmake_args)
    elif processor == "cuda" and "CMAKE_CUDA_ARCHITECTURES" not in named:
        # CUDA's default, the GPUs found at build time, fails where there are none.
        raise click.UsageError(
            "no NVIDIA GPU found here to build for: name the architectures with "
            "--cuda-arch (for example 90 for H100/H200, 80 for A100)"
        )
    try:
        toolkit = None
        if cuda_toolkit != "system":
            toolkit = download_toolkit(cuda_toolkit, root / "toolkits", say=click.echo)
        target = LibsBuilder(
            processor,
            root,
            source=source,
            jobs=jobs,
            cmake_args=cmake_args,
            rpc=rpc,
            tools=tools,
            cuda_toolkit=toolkit,
            say=click.echo,
        ).run(force=force)
    except (LibsError, ToolkitError) as exc:
        raise click.ClickException(str(exc)) from None
    where = "" if lib_path is None else f"KRONK_LIB_PATH={root} "
    click.echo(f"libraries: {target}")
    if rpc:
        click.echo(f"RPC worker: {target / worker_name()} (kronk rpc start --listen HOST:PORT)")
    for tool in tools:
        click.echo(f"{tool}: {target / program_name(tool)}")
    click.echo(
        f"kronk loads them from now on ({where}kronk server start); "
        "KRONK_PROCESSOR chooses another build"
    )


@click.group("rpc", cls=BoolValueGroup)
def rpc() -> None:
    """llama.cpp RPC workers: one model's layers spread over several machines."""


@rpc.command("start")
@click.option(
    "--listen",
    envvar="KRONK_RPC_LISTEN",
    default="127.0.0.1:50052",
    show_default=True,
    help="HOST:PORT the worker listens on. It has no authentication: private networks only",
)
@click.option(
    "--threads",
    "-t",
    type=click.IntRange(min=1),
    envvar="KRONK_RPC_THREADS",
    help="CPU threads the worker computes with [half the cores]",
)
@click.option(
    "--device",
    "-d",
    "devices",
    multiple=True,
    help="A device to offer (CUDA0, Vulkan1, CPU: `kronk devices` lists them), repeatable "
    "[every GPU, else the CPU]",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="KRONK_RPC_CACHE_DIR",
    help="Keep the large tensors clients send in this folder (its rpc/ subfolder), so a "
    "model loads again from the worker's disk instead of over the network",
)
@click.option(
    "--processor",
    type=click.Choice(PROCESSORS, case_sensitive=False),
    help="Which `kronk libs --rpc` build runs the worker [KRONK_PROCESSOR, else the last "
    "one built]",
)
@click.option(
    "--lib-path",
    envvar="KRONK_LIB_PATH",
    type=click.Path(path_type=Path),
    help="Where `kronk libs` installed the build [~/.kronk/libraries]",
)
def rpc_start(
    listen: str,
    threads: int | None,
    devices: tuple[str, ...],
    cache_dir: Path | None,
    processor: str | None,
    lib_path: Path | None,
) -> None:
    """Run a llama.cpp RPC worker (ggml-rpc-server from `kronk libs --rpc`) in the
    foreground: a Kronk elsewhere whose model names this HOST:PORT in rpc_servers puts
    layers on this machine's devices."""
    try:
        endpoint = Endpoint.parse(listen)
        worker = worker_command(
            endpoint,
            root=(lib_path or libraries_root()).expanduser(),
            processor=processor,
            threads=threads,
            devices=devices,
            cache_dir=cache_dir,
        )
        listen_socket(endpoint.host, endpoint.port).close()  # taken: said now, not later
    except (ValueError, KronkError) as exc:
        raise click.ClickException(getattr(exc, "message", str(exc))) from None
    if endpoint.host != "127.0.0.1":
        click.echo(
            f"warning: the RPC worker on {endpoint} takes commands from anyone who reaches "
            "it, without authentication: keep it on a private network",
            err=True,
        )
    environment = dict(os.environ)
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        environment["LLAMA_CACHE"] = str(cache_dir)
    sys.stdout.flush()
    os.execve(worker[0], worker, environment)


def add_commands(group: click.Group) -> None:
    """The kronk_cli hook's work: `kronk server start`'s flags of this plugin, `kronk libs`
    and `kronk rpc`."""
    for option in SERVER_START_OPTIONS:
        add_server_start_option(group, option)
    group.add_command(libs)
    group.add_command(rpc)
