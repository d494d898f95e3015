"""The catalog commands on a running server (the Kronk manual's web mode): the server's
catalogs, Hub and base path, with its auth; the same output as on its files with --local;
this machine's files with --local or --base-path."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from kronk_api import ServerSettings, create_app
from kronk_api.cli import main
from kronk_catalog.remote import answers_at
from kronk_catalog.settings import DEFAULT_HF_ENDPOINT
from kronk_core import Kronk, KronkConfig
from kronk_testing.file_server import FileServer, Served
from kronk_testing.pulls import TINY_PATH, sha256, write_catalog

EXTRA_CATALOG = """\
catalog: Extra
models:
  - id: tiny-extra
    category: Text-Generation
    files:
      models:
        - url: kronk/tiny-GGUF/tiny-llama.gguf
          size: {size}
          sha256: "{sha}"
"""


@dataclass
class WebServer:
    api_host: str
    base: Path
    admin: str
    hub: str

    def as_local(self, output: str) -> str:
        """What the command prints on the server's files with --local, where file URLs
        name the default Hub."""
        return output.replace(self.hub, DEFAULT_HF_ENDPOINT)


@pytest.fixture
def web_server(tmp_path: Path, tiny_llama_path: Path, serve: Any) -> Iterator[WebServer]:
    """Auth on; catalogs with tiny-chat; a Hub that serves its file and a catalog source
    with tiny-extra; no templates source."""
    base = tmp_path / "server"
    write_catalog(base, tiny_llama_path)
    extra = EXTRA_CATALOG.format(size=tiny_llama_path.stat().st_size, sha=sha256(tiny_llama_path))
    with FileServer() as hub:
        hub.routes[TINY_PATH] = Served(path=tiny_llama_path)
        hub.routes["/extra.yaml"] = Served(data=extra.encode())
        catalog = {
            "hf_endpoint": hub.url,
            "source": f"{hub.url}/extra.yaml",
            "templates_source": "",
        }
        sections = {"auth-jwt": {"enabled": True}, "catalog": catalog}
        app = create_app(
            ServerSettings(base_path=base, sections=sections),
            kronk=Kronk(KronkConfig(base_path=base)),
        )
        with serve(app) as base_url:
            admin = (base / "keys" / "master.jwt").read_text()
            yield WebServer(base_url.removeprefix("http://"), base, admin, hub.url)


def kronk(*arguments: str) -> Result:
    return CliRunner().invoke(main, list(arguments))


def on(server: WebServer, *arguments: str) -> Result:
    return kronk(*arguments, "--api-host", server.api_host, "--token", server.admin)


def test_list_and_show_print_the_servers_catalogs_as_local_prints_its_files(
    web_server: WebServer,
) -> None:
    listed = on(web_server, "catalog", "list")
    assert listed.exit_code == 0, listed.output
    assert listed.stdout == kronk("catalog", "list", "--base-path", str(web_server.base)).stdout
    assert any(line.split()[1:3] == ["tiny-chat", "no"] for line in listed.stdout.splitlines())
    as_json = on(web_server, "catalog", "list", "--json", "--filter-category", "text")
    local = kronk(
        *("catalog", "list", "--json", "--filter-category", "text"),
        *("--base-path", str(web_server.base)),
    )
    assert web_server.as_local(as_json.stdout) == local.stdout
    assert '"tiny-chat"' in as_json.stdout
    shown = on(web_server, "catalog", "show", "tiny-chat")
    assert shown.exit_code == 0, shown.output
    local_show = kronk("catalog", "show", "tiny-chat", "--base-path", str(web_server.base))
    assert web_server.as_local(shown.stdout) == local_show.stdout
    missing = on(web_server, "catalog", "show", "no-such")
    assert missing.exit_code == 1 and "404" in missing.output


def test_the_server_asks_for_its_admin_token(web_server: WebServer) -> None:
    refused = kronk("catalog", "list", "--api-host", web_server.api_host)
    assert refused.exit_code == 1
    assert "Error: 401" in refused.output


def test_a_pull_runs_on_the_server_and_updates_its_catalogs_for_a_model_they_lack(
    web_server: WebServer, tiny_llama_path: Path
) -> None:
    pulled = on(web_server, "catalog", "pull", "tiny-extra")
    assert pulled.exit_code == 0, pulled.output
    assert "tiny-extra is not in the server's catalogs: updating them" in pulled.stderr
    assert "updated extra.yaml" in pulled.stderr
    path = Path(pulled.stdout.strip().removeprefix("pulled tiny-extra: "))
    assert path.is_relative_to(web_server.base / "models")
    assert sha256(path) == sha256(tiny_llama_path)
    rows = [line.split() for line in on(web_server, "catalog", "list").stdout.splitlines()]
    assert ["Text-Generation", "tiny-extra", "yes"] in [row[:3] for row in rows]
    by_reference = on(web_server, "model", "pull", "kronk/tiny-GGUF/tiny-llama.gguf")
    assert by_reference.exit_code == 0, by_reference.output
    assert by_reference.stdout.startswith("pulled ")
    assert str(web_server.base / "models") in by_reference.stdout
    updated = on(web_server, "catalog", "update")
    assert (updated.exit_code, updated.stdout) == (0, "updated extra.yaml\n")


def test_what_only_local_files_use_is_refused_on_a_server(web_server: WebServer) -> None:
    refused = on(web_server, "catalog", "pull", "tiny-chat", "--catalog-hf-endpoint", "http://x")
    assert refused.exit_code == 2
    assert "--catalog-hf-endpoint is for this machine's files: add --local" in refused.output
    templates = on(web_server, "catalog", "pull-templates")
    assert templates.exit_code == 1
    assert "catalog.templates_source is empty" in templates.output


def test_local_or_a_base_path_work_on_this_machines_files(
    web_server: WebServer, tmp_path: Path
) -> None:
    mine = tmp_path / "mine"
    for flags in (["--base-path", str(mine)], ["--local", "--base-path", str(mine)]):
        listed = on(web_server, "catalog", "list", *flags)
        assert listed.exit_code == 0, listed.output
        assert "tiny-chat" not in listed.stdout  # the server's catalog is not this one


def test_a_server_is_found_by_whether_one_answers() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert answers_at(f"127.0.0.1:{port}")
    assert not answers_at(f"127.0.0.1:{port}")
    assert not answers_at("no-port")
