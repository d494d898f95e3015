"""`kronk model list|show|rm|ps|unload`: the models this machine's files hold, and those a
running server has loaded."""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from kronk_api.bool_flags import BoolValueGroup
from kronk_api.cli.common import (
    api_host_option,
    base_path_option,
    fail,
    local_config,
    model_config_option,
)
from kronk_api.cli.output import echo_table, mib
from kronk_api.client import call_server
from kronk_core import Kronk
from kronk_core.contract.errors import KronkError
from kronk_core.runtime.loading import model_config_for
from kronk_core.settings.config import ModelConfig
from kronk_core.settings.model_files import delete_model_files, removable_files


@click.group(cls=BoolValueGroup)
def model() -> None:
    """Models: list, show and remove them; what a server has loaded (plugins add: pull)."""


@model.command("list")
@base_path_option
@model_config_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table")
def model_list(base_path: Path | None, model_config_file: Path | None, as_json: bool) -> None:
    """List the models Kronk can serve: size, quantization, trained context length, the
    window a request gets per slot, and file."""
    try:
        config = local_config(base_path, model_config_file)
        with Kronk(config) as kronk:
            found = [_describe(kronk, model_id) for model_id in kronk.models.ids()]
    except KronkError as exc:
        fail(exc)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    rows = [("ID", "SIZE", "QUANTIZATION", "CONTEXT", "WINDOW", "FILE")]
    for entry in found:
        rows.append(
            (
                entry["id"],
                "-" if entry["size_bytes"] is None else mib(entry["size_bytes"]),
                entry["quantization"] or "-",
                str(entry["context_length"] or "-"),
                str(entry["context_window"] or "-"),
                entry["model_path"] or "-",
            )
        )
    echo_table(rows)
    # A broken model is listed, and why it cannot be served is said under the table.
    for entry in found:
        if "error" in entry:
            click.echo(f"{entry['id']}: {entry['error']}")


def _describe(kronk: Kronk, model_id: str) -> dict[str, Any]:
    """A model's file and what the file says: `kronk model list`'s entry. A model that
    cannot be resolved is listed with the reason (`error`) instead."""
    entry: dict[str, Any] = {"id": model_id, "model_path": None, "size_bytes": None}
    keys = ("architecture", "parameters", "quantization", "context_length", "context_window")
    entry.update(dict.fromkeys(keys))
    try:
        path = model_config_for(kronk, model_id).model_path
        assert path is not None  # resolved
        entry["model_path"] = str(path)
        entry["size_bytes"] = sum(part.stat().st_size for part in kronk.models.parts(path))
        facts = kronk.models.facts(model_id)
    except (KronkError, OSError) as exc:
        return {**entry, "error": exc.message if isinstance(exc, KronkError) else str(exc)}
    if facts is not None:
        entry.update(asdict(facts))
    # What a request gets per slot, as a load would choose it now (the trained length,
    # lowered to what fits, or the entry's context_window), beside what the file says.
    entry["context_window"] = kronk.models.context_length(model_id)
    return entry


@model.command("show")
@click.argument("model_id", required=False)
@base_path_option
@model_config_option
def model_show(
    model_id: str | None, base_path: Path | None, model_config_file: Path | None
) -> None:
    """Show a model's file, what the file says (architecture, parameters, quantization,
    context length), its settings, and what loading it would take (memory estimate)."""
    try:
        kronk = Kronk(local_config(base_path, model_config_file, model_id))
        model_id = kronk.models.resolve(model_id, pull=False)
        config = model_config_for(kronk, model_id)
        facts = kronk.models.facts(model_id)
        estimate = kronk.models.memory_estimate(model_id)
    except KronkError as exc:
        fail(exc)
    assert config.model_path is not None  # resolved
    size = sum(part.stat().st_size for part in kronk.models.parts(config.model_path))
    click.echo(f"model:           {model_id}")
    click.echo(f"file:            {config.model_path}")
    click.echo(f"size:            {mib(size)}")
    if facts is not None:
        click.echo(f"architecture:    {facts.architecture}")
        click.echo(f"parameters:      {_count(facts.parameters)} ({facts.parameters:,})")
        click.echo(f"quantization:    {facts.quantization}")
        click.echo(f"context length:  {facts.context_length} (trained)")
    if config.projector_path is not None:
        reads = (
            " and ".join("images" if kind == "image" else "sounds" for kind in estimate.media)
            if estimate is not None
            else "see its backend"
        )
        click.echo(f"projector:       {config.projector_path} (reads {reads or 'nothing'})")
    settings = _settings_set(config)
    width = max([16, *(len(key) + 1 for key in settings)])
    for key, value in settings.items():
        click.echo(f"{key + ':':<{width}} {value}")
    if estimate is None:
        click.echo("memory estimate: not available from its backend")
        return
    projector = f" + projector {mib(estimate.projector_bytes)}" if estimate.projector_bytes else ""
    click.echo(
        f"memory estimate: {mib(estimate.total_bytes)} = weights {mib(estimate.weights_bytes)}"
        f"{projector} + KV cache {mib(estimate.kv_bytes)}"
    )
    click.echo(
        f"  KV cache:      context_window {estimate.context_window} x n_seq_max "
        f"{estimate.n_seq_max} x {estimate.kv_bytes_per_token} bytes per token "
        f"({estimate.n_layer} layers, cache_type_k {estimate.cache_type_k}, "
        f"cache_type_v {estimate.cache_type_v})"
    )
    for share in estimate.placement:
        verdict = "fits" if share.fits else "DOES NOT FIT"
        click.echo(
            f"  on {share.device}: {mib(share.total_bytes)} of {mib(share.memory_free)} free"
            f" ({verdict})"
        )


@model.command("rm")
@click.argument("model_id")
@base_path_option
@model_config_option
@api_host_option
@click.option(
    "--token", envvar="KRONK_TOKEN", help="Admin token, for a server with authentication on"
)
@click.option("--force", is_flag=True, help="Unload it from the running server first")
def model_rm(
    model_id: str,
    base_path: Path | None,
    model_config_file: Path | None,
    api_host: str | None,
    token: str | None,
    force: bool,
) -> None:
    """Delete a model installed or pulled under <base>/models (every part, and a projector
    left alone beside it). Refused while the server at --api-host has it loaded, unless
    --force unloads it there first."""
    try:
        config = local_config(base_path, model_config_file)
        with Kronk(config) as kronk:
            sources = kronk.models.sources()
            removed = removable_files(config, model_id, kronk.models.provided(), sources)
    except KronkError as exc:
        fail(exc)
    files = removed.parts
    host = api_host or "127.0.0.1:8080"
    pool = call_server(host, "GET", "/v1/kronk/models", token=token, absent_ok=True)
    ours = {path.resolve() for path in files}
    loaded = [
        entry["id"]
        for entry in (pool or {"data": []})["data"]
        if Path(entry["model_path"]).resolve() in ours
    ]
    if loaded and not force:
        raise click.ClickException(
            f"{model_id} is loaded on the server at {host} (as {', '.join(loaded)}): "
            "unload it first (`kronk model unload ID`), or pass --force"
        )
    for loaded_id in loaded:
        route = f"/v1/kronk/models/{urllib.parse.quote(loaded_id, safe='')}/unload"
        call_server(host, "POST", route, token=token)
        click.echo(f"unloaded {loaded_id} from the server at {host}")
    size = sum(path.stat().st_size for path in files)
    delete_model_files(config, removed, sources)
    for path in files:
        click.echo(f"deleted {path}")
    click.echo(f"removed {model_id} ({mib(size)})")


model.add_command(model_rm, "remove")


def _settings_set(config: ModelConfig) -> dict[str, Any]:
    """The keys a model's entry sets away from their defaults, plugin sections' as `name.key`."""
    found = config.model_dump(
        mode="json",
        exclude_defaults=True,
        exclude={"id", "model_path", "projector_path", "sections"},
    )
    for name, section in config.sections.items():
        dumped = section.model_dump(mode="json", exclude_defaults=True)
        found.update({f"{name}.{key}": value for key, value in dumped.items()})
    return found


@model.command("ps")
@api_host_option
@click.option(
    "--token", envvar="KRONK_TOKEN", help="Admin token, for a server with authentication on"
)
def model_ps(api_host: str | None, token: str | None) -> None:
    """List the models a running server has loaded: memory, slots, activity, TTL left."""
    pool = call_server(api_host or "127.0.0.1:8080", "GET", "/v1/kronk/models", token=token)
    rows = [("ID", "CAPABILITIES", "MEMORY", "SLOTS", "ACTIVE", "TTL LEFT")]
    for entry in pool["data"]:
        ttl = entry["ttl_left_seconds"]
        rows.append(
            (
                entry["id"],
                ",".join(entry["capabilities"]),
                mib(entry["memory_bytes"]),
                str(entry["slots"]),
                str(entry["active_requests"]),
                "never (kept)" if ttl is None else _duration(ttl),
            )
        )
    echo_table(rows)
    click.echo(f"{len(pool['data'])} of {pool['models_in_cache']} places in use")


@model.command("unload")
@click.argument("model_id")
@api_host_option
@click.option(
    "--token", envvar="KRONK_TOKEN", help="Admin token, for a server with authentication on"
)
def model_unload(model_id: str, api_host: str | None, token: str | None) -> None:
    """Unload a model from a running server now (requests still running on it fail)."""
    path = f"/v1/kronk/models/{urllib.parse.quote(model_id, safe='')}/unload"
    answer = call_server(api_host or "127.0.0.1:8080", "POST", path, token=token)
    click.echo(f"{model_id}: {'unloaded' if answer['unloaded'] else 'was not loaded'}")


def _count(number: int) -> str:
    """134515008 → 134.5M; 8190735360 → 8.2B."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if number >= scale:
            return f"{number / scale:.1f}{suffix}"
    return str(number)


def _duration(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{rest:02d}s" if hours else f"{minutes}m{rest:02d}s"
