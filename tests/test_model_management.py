"""`kronk model list`, `show` and `rm` on real GGUF files, and rm against a real server."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import llama_cpp
import pytest

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig
from kronk_llamacpp.library import ensure_initialised
from kronk_llamacpp.packaged import DEFAULT_MODEL_ID, default_model_path
from kronk_testing.cli import kronk_at as kronk


def parameters(first: Path, *_more_parts: Path) -> int:
    """The weights the model holds, counted by llama.cpp's own loader (which finds a split
    model's other parts from its first). The gguf package's reader counts the same but parses
    every 262k-entry vocabulary in Python first: 50 s for these files against 2."""
    ensure_initialised()
    model = llama_cpp.llama_model_load_from_file(
        str(first).encode(), llama_cpp.llama_model_default_params()
    )
    assert model, first
    try:
        return int(llama_cpp.llama_model_n_params(model))
    finally:
        llama_cpp.llama_model_free(model)


@pytest.fixture
def base(tmp_path: Path, tiny_llama_path: Path, tiny_split_paths: list[Path]) -> Path:
    """A base path with an installed model, a split model beside its projector in a folder
    of its own, and a model-config file naming a model outside <base>/models."""
    models = tmp_path / "models"
    (models / "org" / "split-GGUF").mkdir(parents=True)
    shutil.copy(tiny_llama_path, models / "tiny.gguf")
    for part in tiny_split_paths:
        shutil.copy(part, models / "org" / "split-GGUF" / part.name)
    (models / "org" / "split-GGUF" / "mmproj-tiny-split.gguf").write_bytes(b"GGUF projector")
    config = f"models:\n  outside:\n    model_path: {tiny_llama_path}\n"
    (tmp_path / "models.yaml").write_text(config)
    return tmp_path


def test_list_shows_size_quantization_and_context_length(
    base: Path, tiny_llama_path: Path, tiny_split_paths: list[Path]
) -> None:
    listed = kronk(base, "model", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    entries = {entry["id"]: entry for entry in json.loads(listed.stdout)}
    assert {"tiny", "tiny-split", DEFAULT_MODEL_ID} <= set(entries)
    tiny = entries["tiny"]
    assert tiny == {
        "id": "tiny",
        "model_path": str(base / "models" / "tiny.gguf"),
        "size_bytes": tiny_llama_path.stat().st_size,
        "architecture": "llama",
        "parameters": parameters(tiny_llama_path),
        "quantization": "F16",
        "context_length": 256,
        "context_window": 256,
    }
    split = entries["tiny-split"]  # every part counted, the projector not a model
    assert split["size_bytes"] == sum(part.stat().st_size for part in tiny_split_paths)
    assert split["parameters"] == parameters(*tiny_split_paths) == tiny["parameters"]
    default = entries[DEFAULT_MODEL_ID]
    assert (default["quantization"], default["context_length"]) == ("Q4_1", 8192)
    assert default["parameters"] == parameters(default_model_path())
    table = kronk(base, "model", "list").stdout.splitlines()
    assert table[0].split() == ["ID", "SIZE", "QUANTIZATION", "CONTEXT", "WINDOW", "FILE"]
    row = next(line for line in table if line.startswith("tiny "))
    tiny_file = str(base / "models" / "tiny.gguf")
    assert row.split()[1:] == ["38.4", "MiB", "F16", "256", "256", tiny_file]


def test_show_names_the_architecture_and_the_parameters(base: Path) -> None:
    shown = kronk(base, "model", "show")
    assert shown.returncode == 0, shown.stderr
    lines = [" ".join(line.split()) for line in shown.stdout.splitlines()]
    count = parameters(default_model_path())
    for expected in (
        f"model: {DEFAULT_MODEL_ID}",
        "architecture: llama",
        f"parameters: {count / 1e6:.1f}M ({count:,})",
        "quantization: Q4_1",
        "context length: 8192 (trained)",
    ):
        assert expected in lines, shown.stdout


def test_rm_deletes_an_installed_model(base: Path) -> None:
    removed = kronk(base, "model", "rm", "tiny")
    assert removed.returncode == 0, removed.stderr
    assert f"deleted {base / 'models' / 'tiny.gguf'}" in removed.stdout
    assert not (base / "models" / "tiny.gguf").exists()
    listed = [entry["id"] for entry in json.loads(kronk(base, "model", "list", "--json").stdout)]
    assert "tiny" not in listed


def test_remove_deletes_every_part_the_projector_and_the_emptied_folders(base: Path) -> None:
    removed = kronk(base, "model", "remove", "tiny-split")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.count("deleted ") == 2
    assert not (base / "models" / "org").exists()
    assert (base / "models" / "tiny.gguf").exists()


@pytest.mark.parametrize(
    ("model_id", "why"),
    [
        (DEFAULT_MODEL_ID, "comes with a PyPI package"),
        ("outside", "which is not under"),
        ("no-such-model", "'no-such-model' not found. Models here: outside, tiny-split, tiny,"),
    ],
)
def test_rm_refuses_what_kronk_did_not_install(base: Path, model_id: str, why: str) -> None:
    refused = kronk(base, "model", "rm", model_id, "--model-config-file", str(base / "models.yaml"))
    assert refused.returncode == 1
    assert why in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.fixture
def server_with_tiny_loaded(base: Path, serve: Any) -> Iterator[tuple[str, Kronk]]:
    instance = Kronk(KronkConfig(base_path=base))
    with serve(create_app(ServerSettings(base_path=base), kronk=instance)) as url:
        instance.load("tiny")
        yield url.removeprefix("http://"), instance


def test_rm_is_refused_while_the_server_has_it_loaded_unless_forced(
    base: Path, server_with_tiny_loaded: tuple[str, Kronk]
) -> None:
    host, server = server_with_tiny_loaded
    refused = kronk(base, "model", "rm", "tiny", "--api-host", host)
    assert refused.returncode == 1
    assert f"tiny is loaded on the server at {host} (as tiny)" in refused.stderr
    assert "--force" in refused.stderr
    assert (base / "models" / "tiny.gguf").exists()
    assert server.get_loaded("tiny") is not None

    forced = kronk(base, "model", "rm", "tiny", "--api-host", host, "--force")
    assert forced.returncode == 0, forced.stderr
    assert f"unloaded tiny from the server at {host}" in forced.stdout
    assert server.get_loaded("tiny") is None
    assert not (base / "models" / "tiny.gguf").exists()
    pool = httpx.get(f"http://{host}/v1/kronk/models").json()
    assert pool["data"] == []


def test_the_server_deletes_a_model_as_rm_does(
    base: Path, server_with_tiny_loaded: tuple[str, Kronk], tiny_llama_path: Path
) -> None:
    """DELETE /v1/kronk/models/{id}, which the UI's Delete button calls: the same files and
    the same refusals as `kronk model rm`."""
    host, server = server_with_tiny_loaded
    models = f"http://{host}/v1/kronk/models"
    refused = httpx.delete(f"{models}/tiny")
    assert refused.status_code == 409
    assert "tiny is loaded (as tiny)" in refused.json()["error"]["message"]
    assert (base / "models" / "tiny.gguf").exists()
    packaged = httpx.delete(f"{models}/{DEFAULT_MODEL_ID}")
    assert packaged.status_code == 400
    assert "comes with a PyPI package" in packaged.json()["error"]["message"]
    assert httpx.delete(f"{models}/no-such-model").status_code == 404

    deleted = httpx.delete(f"{models}/tiny", params={"force": "true"})
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {
        "id": "tiny",
        "deleted": [str(base / "models" / "tiny.gguf")],
        "size_bytes": tiny_llama_path.stat().st_size,
        "unloaded": ["tiny"],
    }
    assert server.get_loaded("tiny") is None
    assert not (base / "models" / "tiny.gguf").exists()
    listed = [entry["id"] for entry in json.loads(kronk(base, "model", "list", "--json").stdout)]
    assert "tiny" not in listed
