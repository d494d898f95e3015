"""Models from a path and from folders of models: `--model ./x.gguf` (llama-server's `-m`)
serves that file under its name, wherever a model is named; `model_dirs` (`--model-dirs`,
KRONK_MODEL_DIRS) adds folders beside <base>/models, listed by `/v1/models` and `kronk model
list` and never deleted by Kronk; a file a request names is served only if it is a model
Kronk already serves. On the tiny generated model: what is checked is naming, not a model."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from click.testing import CliRunner

from kronk_api import ServerSettings, create_app
from kronk_api.cli import main
from kronk_core import Kronk, KronkConfig
from kronk_core.contract.errors import ConfigError, ModelNotFoundError

if TYPE_CHECKING:
    from kronk_testing.server import Serve


@pytest.fixture
def folders(tmp_path: Path, tiny_llama_path: Path) -> tuple[Path, Path, Path]:
    """A base path with `tiny` in its models folder, and two more folders: `a` holds
    `shared` and `tiny` (hidden by the base's), `b` holds `shared` (hidden by a's) and `own`."""
    base, a, b = tmp_path / "base", tmp_path / "a", tmp_path / "b"
    placed = ((base / "models", ["tiny"]), (a, ["shared", "tiny"]), (b, ["shared", "own"]))
    for folder, names in placed:
        folder.mkdir(parents=True)
        for name in names:
            shutil.copyfile(tiny_llama_path, folder / f"{name}.gguf")
    return base, a, b


def test_model_folders_are_listed_after_the_base_s_first_file_winning(
    folders: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    base, a, b = folders
    monkeypatch.delenv("KRONK_MODEL_DIRS", raising=False)
    with Kronk(KronkConfig(base_path=base, model_dirs=[a, b])) as kronk:
        installed = kronk.models.sources().installed
        assert {"tiny", "shared", "own"} <= set(kronk.models.ids())
        assert installed["tiny"].path == base / "models" / "tiny.gguf"
        assert installed["shared"].path == a / "shared.gguf"
        assert installed["own"].path == b / "own.gguf"
    # The variable: folders separated by the path separator or commas.
    monkeypatch.setenv("KRONK_MODEL_DIRS", f"{a}{os.pathsep}{b}")
    assert KronkConfig(base_path=base).model_dirs == [a, b]
    monkeypatch.setenv("KRONK_MODEL_DIRS", f"{b}, {a}")
    assert KronkConfig(base_path=base).model_dirs == [b, a]
    monkeypatch.setenv("KRONK_MODEL_DIRS", str(base / "missing"))
    with pytest.raises(ConfigError, match=r"model_dirs: .*missing is not a folder"):
        ServerSettings(base_path=base).kronk_config()


async def test_a_model_named_by_its_file_is_served_under_its_name(
    folders: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    base, a, b = folders
    monkeypatch.delenv("KRONK_MODEL_DIRS", raising=False)
    monkeypatch.chdir(b)
    config = KronkConfig(base_path=base, default_model="./own.gguf", model_dirs=[a])
    assert config.default_model == "own"
    assert config.models["own"].model_path == b / "own.gguf"
    with Kronk(config) as kronk:
        answer = await kronk.complete("Hello", max_tokens=2, model="./own.gguf")
        assert answer.usage.completion_tokens == 2
        assert [model.id for model in kronk.loaded_models()] == ["own"]
        # Any file of a model it serves, by any path; a file it does not serve is no model.
        assert kronk.models.resolve(str(a / "shared.gguf")) == "shared"
        assert kronk.models.resolve("../a/./shared.gguf") == "shared"
        # b's shared.gguf (here, in the working folder) is hidden by a's; a model file in
        # no model folder is no model either: a name does not make Kronk open a file.
        stray = base.parent / "stray.gguf"
        shutil.copyfile(b / "own.gguf", stray)
        for unserved in ("./shared.gguf", str(stray)):
            with pytest.raises(ModelNotFoundError, match=f"model '{unserved}' not found"):
                await kronk.complete("Hello", max_tokens=1, model=unserved)
    with pytest.raises(ConfigError, match=r"default_model: \./gone\.gguf: no such file"):
        KronkConfig(base_path=base, default_model="./gone.gguf")


def test_the_cli_lists_shows_and_runs_models_by_path_and_folder(
    folders: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    base, a, b = folders
    runner = CliRunner()
    env = {"KRONK_MODEL_DIRS": f"{a},{b}"}
    listed = runner.invoke(main, ["model", "list", "--base-path", str(base)], env=env)
    assert listed.exit_code == 0, listed.output
    rows = {line.split()[0]: line.split()[-1] for line in listed.output.splitlines()[1:]}
    assert rows["shared"] == str(a / "shared.gguf") and rows["own"] == str(b / "own.gguf")
    shown = runner.invoke(main, ["model", "show", str(b / "own.gguf"), "--base-path", str(base)])
    assert shown.exit_code == 0, shown.output
    assert "model:           own" in shown.output
    # Kronk did not put it there: it does not delete it.
    removed = runner.invoke(main, ["model", "rm", "own", "--base-path", str(base)], env=env)
    assert removed.exit_code == 1
    assert "not under" in removed.output and (b / "own.gguf").is_file()
    missing = runner.invoke(
        main, ["model", "list", "--base-path", str(base)], env={"KRONK_MODEL_DIRS": "/nowhere"}
    )
    assert missing.exit_code == 1
    assert "model_dirs: /nowhere is not a folder" in missing.output


def test_the_server_lists_the_folders_models_and_serves_its_model_by_path(
    folders: tuple[Path, Path, Path], serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, a, b = folders
    monkeypatch.delenv("KRONK_MODEL_DIRS", raising=False)
    settings = ServerSettings(base_path=base, model=str(b / "own.gguf"), model_dirs=[a])
    with serve(create_app(settings), lifespan="on") as base_url:
        ids = {card["id"] for card in httpx.get(f"{base_url}/v1/models").json()["data"]}
        assert {"own", "shared", "tiny"} <= ids
        ready = httpx.get(f"{base_url}/v1/readiness").json()
        assert ready["model"] == "own"
        answer = httpx.post(
            f"{base_url}/v1/completions",
            json={"model": str(b / "own.gguf"), "prompt": "Hello", "max_tokens": 1},
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == "own"
