"""The llamacpp plugin's command: `kronk libs`."""

from __future__ import annotations

from pathlib import Path

import click

from kronk_llamacpp.libs import LibsBuilder, LibsError
from kronk_llamacpp.native import PROCESSORS, libraries_root


def add_commands(group: click.Group) -> None:
    @group.command("libs")
    @click.option(
        "--processor",
        envvar="KRONK_PROCESSOR",
        type=click.Choice(PROCESSORS, case_sensitive=False),
        default="cpu",
        show_default=True,
        help="Which llama.cpp backend to build",
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
    def libs(
        processor: str,
        lib_path: Path | None,
        source: Path | None,
        jobs: int | None,
        cmake_args: tuple[str, ...],
        force: bool,
    ) -> None:
        """Build and install llama.cpp's libraries for a processor (cpu, cuda, vulkan, metal)."""
        root = (lib_path or libraries_root()).expanduser()
        processor = processor.lower()
        try:
            target = LibsBuilder(
                processor, root, source=source, jobs=jobs, cmake_args=cmake_args, say=click.echo
            ).run(force=force)
        except LibsError as exc:
            raise click.ClickException(str(exc)) from None
        where = "" if lib_path is None else f"KRONK_LIB_PATH={root} "
        click.echo(f"libraries: {target}")
        click.echo(f"use them with: {where}KRONK_PROCESSOR={processor} kronk server start")
