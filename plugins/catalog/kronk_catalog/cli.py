"""`kronk catalog list|show|pull|update|pull-templates` and `kronk model pull`: on a
running server (the manual's web mode, kronk_catalog.remote) or on this machine's files.

A running server sees what these commands pull on its machine at once: the catalog
plugin answers `kronk_models` from the files on disk.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import urllib.parse
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console

from kronk_api.contract import BoolValueGroup, add_server_start_option, setting_option
from kronk_catalog.catalog import Catalog
from kronk_catalog.download import Downloader, FileSpec
from kronk_catalog.plans import catalog_files, reference_files
from kronk_catalog.progress import pull_with_progress
from kronk_catalog.pulls import Pull
from kronk_catalog.remote import DEFAULT_API_HOST, Server, pull_on, server_for
from kronk_catalog.routes import describe, installed_packages
from kronk_catalog.settings import (
    DEFAULT_HF_ENDPOINT,
    DEFAULT_SOURCE,
    DEFAULT_TEMPLATES_SOURCE,
    HF_TOKEN_VARIABLE,
    REPOSITORY_VARIABLES,
    default_source,
    github_folder,
    hub_endpoint,
    hub_token,
)
from kronk_catalog.update import update_catalogs, update_templates
from kronk_core.contract import Kronk, KronkConfig, KronkError, default_base_path

_base_path = setting_option(
    "base_path", type=click.Path(path_type=Path), help="Base directory for Kronk data [~/.kronk]"
)
_hf_endpoint = setting_option(
    "catalog.hf_endpoint",
    help=f"The Hugging Face Hub of model references [HF_ENDPOINT, else {DEFAULT_HF_ENDPOINT}]",
)
_hf_token = click.option(
    "--hf-token",
    envvar=["KRONK_CATALOG_HF_TOKEN", HF_TOKEN_VARIABLE],
    help=f"Hugging Face token for gated models (env {HF_TOKEN_VARIABLE}; else HF_TOKEN or the "
    "token `hf auth login` saved)",
)

_local = click.option(
    "--local", is_flag=True, help="Work on this machine's files, not on a running server"
)
_api_host = setting_option(
    "api_host",
    help=f"HOST:PORT of the server to work on [{DEFAULT_API_HOST}, where one answers]",
)
_token = click.option(
    "--token", envvar="KRONK_TOKEN", help="Admin token, for a server with authentication on"
)
# What only this machine's files use: given on the command line to a server, a usage error.
_LOCAL_ONLY = ("catalog_hf_endpoint", "hf_token", "catalog_source", "catalog_templates_source")


def _server_or_local(command: Callable[..., None]) -> Callable[..., None]:
    """The command's `server`: the running server it works on, or None for this machine's
    files (kronk_catalog.remote.server_for)."""

    @functools.wraps(command)
    def run(local: bool, api_host: str | None, token: str | None, **options: Any) -> None:
        server = server_for(
            local=local,
            base_path_given=options.get("base_path") is not None,
            api_host=api_host,
            token=token,
        )
        if server is not None:
            context = click.get_current_context()
            for name in _LOCAL_ONLY:
                if context.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE:
                    flag = "--" + name.replace("_", "-")
                    raise click.UsageError(
                        f"{flag} is for this machine's files: add --local (the server at "
                        f"{server.api_host} uses its own settings)"
                    )
        command(server=server, **options)

    return _local(_api_host(_token(run)))


_catalog_source = setting_option(
    "catalog.source",
    help=f"Where the catalogs come from [the catalogs/ folder of "
    f"{REPOSITORY_VARIABLES['catalogs']}'s repository, else {DEFAULT_SOURCE}]",
)
_templates_source = setting_option(
    "catalog.templates_source",
    help=f"Where their chat templates come from, '' for nowhere [the templates/ folder of "
    f"{REPOSITORY_VARIABLES['templates']}'s repository, else {DEFAULT_TEMPLATES_SOURCE}]",
)


def _update(base: Path, source: str | None, templates_source: str | None) -> list[Path]:
    """`kronk catalog update`: the catalogs and their templates fetched; the paths written."""
    templates = default_source("templates") if templates_source is None else templates_source
    written: list[Path] = []

    async def run() -> None:
        written.extend(await update_catalogs(source or default_source("catalogs"), base, templates))

    _run(run())
    return written


def _refreshed(
    base: Path, model_id: str, source: str | None, templates_source: str | None
) -> Catalog:
    """The catalogs fetched anew for a model they lacked (a fresh install has none but the
    bundled one); where the source cannot be reached, an error that says what to run."""
    click.echo(f"{model_id} is not in the local catalogs: updating them", err=True)
    try:
        for path in _update(base, source, templates_source):
            click.echo(f"updated {path}", err=True)
    except KronkError as exc:
        raise click.ClickException(
            f"model {model_id!r} is not in the local catalogs, and updating them failed "
            f"({exc.message}); run `kronk catalog update` once the source can be reached"
        ) from None
    return Catalog(base)


def _base(value: Path | None) -> Path:
    return (value or default_base_path()).expanduser()


def _cli_errors(command: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(command)
    def run(**options: Any) -> None:
        try:
            command(**options)
        except KronkError as exc:
            raise click.ClickException(exc.message) from None

    return run


def _pull(
    model: str, files: list[FileSpec], kind: str, hf_endpoint: str, hf_token: str | None
) -> None:
    async def run() -> None:
        downloader = Downloader(hf_endpoint=hf_endpoint, hf_token=hf_token)
        pull = Pull(model=model, files=files, kind=kind)
        await pull_with_progress(pull, downloader, Console(stderr=True))

    _run(run())
    click.echo(f"pulled {model}: {files[0].dest}")


def _run(work: Coroutine[Any, Any, None]) -> None:
    try:
        asyncio.run(work)
    except KeyboardInterrupt:
        raise click.ClickException(
            "interrupted; the same command resumes where this one stopped"
        ) from None


def _packaged() -> set[str]:
    """The model ids installed PyPI packages serve, as the plugins say."""
    return installed_packages(Kronk(KronkConfig()))


def _pulled(entry: dict[str, Any]) -> str:
    """`yes`; `package` for a model an installed PyPI package serves (nothing to pull)."""
    return "yes" if entry["pulled"] else "package" if entry["packaged"] else "no"


def _echo_table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        click.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


def _export_token(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """The manual's `server start --hf-token`: the process's token for every pull (the
    catalog section's setting, and pulls of model references, which read the variable)."""
    if value is not None:
        os.environ["KRONK_CATALOG_HF_TOKEN"] = value


def _export_source(variable: str, folder: str) -> Callable[..., None]:
    """A callback that sets a source setting's variable from the manual's repository flag
    (the rule's flag, --catalog-source, beats it)."""

    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value is not None:
            os.environ[variable] = github_folder(value, folder)

    return callback


# The variable of `catalog.check_integrity` by the rule.
INTEGRITY_VARIABLE = "KRONK_CATALOG_CHECK_INTEGRITY"


def _export_integrity(ctx: click.Context, param: click.Parameter, value: bool | None) -> None:
    """The manual's `--ignore-integrity-check=false` (`KRONK_CACHE_IGNORE_INTEGRITY_CHECK`):
    `catalog.check_integrity` on, unless its own flag or variable says otherwise."""
    if value is not None:
        os.environ.setdefault(INTEGRITY_VARIABLE, "false" if value else "true")


# The Kronk manual's flags of `kronk server start` this plugin reads: each sets a variable
# of the process.
SERVER_START_OPTIONS = (
    click.Option(
        ["--ignore-integrity-check"],
        type=click.BOOL,
        is_flag=False,
        flag_value=True,
        envvar="KRONK_CACHE_IGNORE_INTEGRITY_CHECK",
        expose_value=False,
        callback=_export_integrity,
        metavar="BOOL",
        help="The manual's switch: =false checks every pulled catalog model's files "
        f"against their sha256 at the start ({INTEGRITY_VARIABLE} beats it)",
    ),
    click.Option(
        ["--hf-token"],
        expose_value=False,
        callback=_export_token,
        help=f"Hugging Face token for the server's pulls (env {HF_TOKEN_VARIABLE}; "
        "--catalog-hf-token beats it)",
    ),
    *(
        click.Option(
            [flag],
            expose_value=False,
            callback=_export_source(variable, folder),
            metavar="URL",
            help=f"The manual's GitHub repository of the {folder} (its {folder}/ folder "
            f"becomes {variable})",
        )
        for flag, variable, folder in (
            ("--catalog-github-repo", "KRONK_CATALOG_SOURCE", "catalogs"),
            ("--templates-github-repo", "KRONK_CATALOG_TEMPLATES_SOURCE", "templates"),
        )
    ),
)


@click.group("catalog", cls=BoolValueGroup)
def catalog() -> None:
    """The catalog of verified models: list, show, pull, update."""


@catalog.command("list")
@click.option("--filter-category", help="Only categories starting with this (any case)")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table")
@_base_path
@_server_or_local
@_cli_errors
def catalog_list(
    filter_category: str | None, as_json: bool, base_path: Path | None, server: Server | None
) -> None:
    """List the catalog's models and whether each is pulled."""
    if server is not None:
        query = f"?{urllib.parse.urlencode({'category': filter_category})}"
        listed = server.call("GET", "/v1/kronk/catalog" + (query if filter_category else ""))
        problems = [(problem["file"], problem["message"]) for problem in listed["problems"]]
        entries = listed["data"]
    else:
        base = _base(base_path)
        found = Catalog(base)
        problems = found.problems
        packaged = _packaged()
        entries = [
            describe(entry, base, DEFAULT_HF_ENDPOINT, packaged)
            for entry in found.list(filter_category)
        ]
    for where, why in problems:
        click.echo(f"warning: {where} skipped: {why}", err=True)
    if as_json:
        click.echo(json.dumps(entries, indent=2))
        return
    rows = [("CATALOG", "MODEL ID", "PULLED", "ENDPOINT")]
    rows += [
        (entry["category"], entry["id"], _pulled(entry), entry["endpoint"]) for entry in entries
    ]
    _echo_table(rows)


@catalog.command("show")
@click.argument("model_id")
@_base_path
@_server_or_local
@_cli_errors
def catalog_show(model_id: str, base_path: Path | None, server: Server | None) -> None:
    """Show a catalog model: files, checksums, settings, where it is stored."""
    if server is not None:
        entry = server.call("GET", f"/v1/kronk/catalog/{urllib.parse.quote(model_id)}")
    else:
        base = _base(base_path)
        entry = describe(Catalog(base).get(model_id), base, DEFAULT_HF_ENDPOINT, _packaged())
    for key in ("id", "category", "endpoint", "owned_by", "web_page", "description"):
        if entry[key]:
            click.echo(f"{key + ':':<14}{entry[key]}")
    click.echo(f"{'pulled:':<14}{_pulled(entry)}")
    click.echo(f"{'model path:':<14}{entry['model_path']}")
    if entry["projector_path"]:
        click.echo(f"{'projector:':<14}{entry['projector_path']}")
    click.echo("files:")
    if entry["template"]:
        used = entry["template_used"] or "not fetched (kronk catalog update); the GGUF's own"
        click.echo(f"{'template:':<14}{entry['template']}: {used}")
    for file in entry["files"]:
        size = "size unknown" if file["size"] is None else f"{file['size']} bytes"
        size = size if file["size_exact"] or file["size"] is None else f"about {size}"
        click.echo(f"  {file['url']}\n    {size}, sha256 {file['sha256'] or 'not given'}")
    if entry["config"]:
        click.echo("settings:")
        click.echo(
            yaml.safe_dump(entry["config"], sort_keys=False)
            .rstrip()
            .replace("\n", "\n  ")
            .join(["  ", ""])
        )
    click.echo(f"{'catalog file:':<14}{entry['catalog_file']}")


@catalog.command("pull")
@click.argument("model_id")
@_base_path
@_hf_endpoint
@_hf_token
@_catalog_source
@_templates_source
@_server_or_local
@_cli_errors
def catalog_pull(
    model_id: str,
    base_path: Path | None,
    catalog_hf_endpoint: str | None,
    hf_token: str | None,
    catalog_source: str | None,
    catalog_templates_source: str | None,
    server: Server | None,
) -> None:
    """Download a catalog model (resumes an interrupted pull; checks every sha256). A
    model the catalogs lack is looked for in the catalog source first, as
    `kronk catalog update` fetches it."""
    if server is not None:
        listed = server.call("GET", "/v1/kronk/catalog")["data"]
        if model_id not in {entry["id"] for entry in listed}:
            click.echo(f"{model_id} is not in the server's catalogs: updating them", err=True)
            for name in server.call("POST", "/v1/kronk/catalog/update")["updated"]:
                click.echo(f"updated {name}", err=True)
        pulled = pull_on(server, {"model": model_id})
        click.echo(f"pulled {model_id}: {pulled['files'][0]['path']}")
        return
    base = _base(base_path)
    endpoint = hub_endpoint(catalog_hf_endpoint)
    found = Catalog(base)
    if model_id not in found.entries:
        found = _refreshed(base, model_id, catalog_source, catalog_templates_source)
    files = catalog_files(found, model_id, base, endpoint)
    _pull(model_id, files, "catalog", endpoint, hub_token(hf_token))


@catalog.command("pull-templates")
@_base_path
@_templates_source
@_server_or_local
@_cli_errors
def catalog_pull_templates(
    base_path: Path | None, catalog_templates_source: str | None, server: Server | None
) -> None:
    """Fetch the chat templates alone (into <base>/templates), as `catalog update` does
    with the catalogs: what a catalog model's `template` names."""
    if server is not None:
        for name in server.call("POST", "/v1/kronk/catalog/templates/update")["updated"]:
            click.echo(f"updated {name}")
        return
    source = catalog_templates_source or default_source("templates")
    written: list[Path] = []

    async def run() -> None:
        written.extend(await update_templates(source, _base(base_path)))

    _run(run())
    for path in written:
        click.echo(f"updated {path}")


@catalog.command("update")
@_base_path
@_catalog_source
@_templates_source
@_server_or_local
@_cli_errors
def catalog_update(
    base_path: Path | None,
    catalog_source: str | None,
    catalog_templates_source: str | None,
    server: Server | None,
) -> None:
    """Fetch the catalogs (into <base>/catalogs) and their chat templates (into
    <base>/templates) from the catalog source."""
    if server is not None:
        for name in server.call("POST", "/v1/kronk/catalog/update")["updated"]:
            click.echo(f"updated {name}")
        return
    for path in _update(_base(base_path), catalog_source, catalog_templates_source):
        click.echo(f"updated {path}")


@click.command("pull")
@click.argument("reference", metavar="REFERENCE")
@click.option("--proj", help="A file model's projector (mmproj) file, URL or HF-REPO/FILE")
@_base_path
@_hf_endpoint
@_hf_token
@_server_or_local
@_cli_errors
def model_pull(
    reference: str,
    proj: str | None,
    base_path: Path | None,
    catalog_hf_endpoint: str | None,
    hf_token: str | None,
    server: Server | None,
) -> None:
    """Download a GGUF model by its Hugging Face name or its URL.

    REFERENCE is a repository, `org/repo` or `org/repo:QUANT` (also `hf.co/org/repo:QUANT`
    or its page URL): the quantization's file (Q4_K_M when none is named), all its parts,
    and a projector beside it. Or one file: `org/repo/file.gguf`, or any http(s) URL.
    """
    if server is not None:
        pulled = pull_on(server, {"url": reference, "proj": proj})
        click.echo(f"pulled {pulled['model']}: {pulled['files'][0]['path']}")
        return
    base = _base(base_path)
    endpoint, token = hub_endpoint(catalog_hf_endpoint), hub_token(hf_token)
    model_id, files = reference_files(reference, proj, base, endpoint, token)
    _pull(model_id, files, "url", endpoint, token)


def add_commands(group: click.Group) -> None:
    """The kronk_cli hook's work: `kronk server start`'s flags of this plugin, `kronk catalog`,
    and `kronk model pull` in the core's `model` group."""
    for option in SERVER_START_OPTIONS:
        add_server_start_option(group, option)
    group.add_command(catalog)
    model = group.commands.get("model")
    if isinstance(model, click.Group):
        model.add_command(model_pull)
