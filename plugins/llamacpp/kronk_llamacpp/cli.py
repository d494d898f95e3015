"""The llamacpp plugin's command: `kronk libs`."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import click

from kronk_api.options import add_server_start_option
from kronk_core.errors import ConfigError
from kronk_llamacpp import native
from kronk_llamacpp.detect import detect
from kronk_llamacpp.libs import LibsBuilder, LibsError
from kronk_llamacpp.native import PROCESSORS, libraries_root

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
        expose_value=False,  # read before the plugins load (kronk_api.cli.EARLY_VARIABLES)
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


def add_commands(group: click.Group) -> None:
    for option in SERVER_START_OPTIONS:
        add_server_start_option(group, option)

    @group.command("libs")
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
        named = {arg.removeprefix("-D").split("=")[0].split(":")[0] for arg in cmake_args}
        if detected.processor == processor and not named & set(_ARCHITECTURE_VARIABLES):
            cmake_args = (*detected.cmake_args, *cmake_args)
        try:
            target = LibsBuilder(
                processor, root, source=source, jobs=jobs, cmake_args=cmake_args, say=click.echo
            ).run(force=force)
        except LibsError as exc:
            raise click.ClickException(str(exc)) from None
        where = "" if lib_path is None else f"KRONK_LIB_PATH={root} "
        click.echo(f"libraries: {target}")
        click.echo(
            f"kronk loads them from now on ({where}kronk server start); "
            "KRONK_PROCESSOR chooses another build"
        )
