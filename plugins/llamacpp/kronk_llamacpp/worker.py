"""`kronk rpc start`: the command line of llama.cpp's RPC worker from a `kronk libs --rpc`
build."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from pathlib import Path

from kronk_core.contract import ConfigError
from kronk_llamacpp import native
from kronk_llamacpp.endpoint import Endpoint
from kronk_llamacpp.libs import worker_name


def _processor(root: Path, named: str | None) -> str:
    """The processor named, else KRONK_PROCESSOR, else the one `kronk libs` last built here."""
    chosen = named.lower() if named else native.selected_processor()
    if chosen:
        return chosen
    try:
        remembered = json.loads((root / native.REMEMBERED).read_text())["processor"]
    except (OSError, ValueError, KeyError, TypeError):
        remembered = None
    if remembered not in native.PROCESSORS:
        raise ConfigError(
            "--processor", f"no `kronk libs` build in {root}: build one with `kronk libs --rpc`"
        )
    return str(remembered)


def worker_command(
    endpoint: Endpoint,
    *,
    root: Path,
    processor: str | None = None,
    threads: int | None = None,
    devices: Sequence[str] = (),
    cache_dir: Path | None = None,
) -> list[str]:
    """ggml-rpc-server's argv (llama.cpp's own flags) for these options; ConfigError when
    the build has no worker."""
    try:
        ipaddress.IPv4Address(endpoint.host)
    except ValueError:
        raise ConfigError(
            "--listen",
            f"the worker listens on an IPv4 address (0.0.0.0: all), not {endpoint.host!r}",
        ) from None
    chosen = _processor(root, processor)
    worker = root / chosen / worker_name()
    if not worker.is_file():
        built = (root / chosen / native.MANIFEST).is_file()
        what = (
            f"the {chosen} build in {root / chosen} has no RPC worker"
            if built
            else (f"no {chosen} build in {root / chosen}")
        )
        raise ConfigError(
            "--processor", f"{what}: build it with `kronk libs --processor {chosen} --rpc`"
        )
    command = [str(worker), "--host", endpoint.host, "--port", str(endpoint.port)]
    if threads is not None:
        command += ["--threads", str(threads)]
    if devices:
        command += ["--device", ",".join(devices)]
    if cache_dir is not None:
        command.append("--cache")  # in $LLAMA_CACHE/rpc: kronk rpc start sets LLAMA_CACHE
    return command
