"""The manual's integrity check: `kronk server start --ignore-integrity-check=false`
(`catalog.check_integrity`) reads every pulled catalog model's files at the start and
refuses to serve when one no longer matches its catalog's sha256."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from litestar.testing import TestClient

import kronk_api.cli.server
from kronk_api import ServerSettings, create_app
from kronk_api.cli import main
from kronk_catalog.catalog import Catalog
from kronk_catalog.cli import INTEGRITY_VARIABLE
from kronk_catalog.integrity import check_pulled_models
from kronk_catalog.plans import models_dir
from kronk_catalog.settings import SETTINGS
from kronk_core import Kronk, KronkConfig
from kronk_core.contract.errors import ConfigError
from kronk_testing.pulls import write_catalog

HUB = "http://127.0.0.1:9"  # never asked: the files are on disk


def pulled_file(base: Path) -> Path:
    (spec,) = Catalog(base).get("tiny-chat").specs(models_dir(base), HUB)
    return spec.dest


@pytest.fixture
def base(tmp_path: Path, tiny_llama_path: Path) -> Path:
    """A base path whose catalog model tiny-chat is pulled (tiny-missing is not)."""
    write_catalog(tmp_path, tiny_llama_path)
    pulled = pulled_file(tmp_path)
    pulled.parent.mkdir(parents=True)
    shutil.copy(tiny_llama_path, pulled)
    return tmp_path


def corrupt(base: Path) -> Path:
    pulled = pulled_file(base)
    with pulled.open("r+b") as file:
        file.seek(-1, os.SEEK_END)
        last = file.read(1)
        file.seek(-1, os.SEEK_END)
        file.write(bytes([last[0] ^ 0xFF]))
    return pulled


def test_pulled_files_that_match_are_counted_and_one_that_differs_is_named(base: Path) -> None:
    assert check_pulled_models(base, HUB) == 1
    pulled = corrupt(base)
    with pytest.raises(ConfigError) as info:
        check_pulled_models(base, HUB)
    assert info.value.key == "catalog.check_integrity"
    assert f"{pulled} (tiny-chat) does not match its catalog's sha256" in str(info.value)
    assert "kronk catalog pull tiny-chat" in str(info.value)


def serves(base: Path, check: bool) -> None:
    settings = ServerSettings(base_path=base, sections={"catalog": {"check_integrity": check}})
    with TestClient(create_app(settings, kronk=Kronk(KronkConfig(base_path=base)))) as client:
        assert client.get("/v1/liveness").status_code == 200


def test_a_server_that_checks_refuses_to_start_on_a_changed_file(base: Path) -> None:
    corrupt(base)
    serves(base, check=False)  # the default: pulls check what they download, starts do not
    with pytest.raises(BaseExceptionGroup) as info:
        serves(base, check=True)
    assert info.group_contains(ConfigError, match=r"^catalog\.check_integrity: .*tiny-chat")


@pytest.mark.parametrize(
    ("arguments", "environ", "expected"),
    [
        (["--ignore-integrity-check=false"], {}, True),
        (["--ignore-integrity-check", "false"], {}, True),
        (["--ignore-integrity-check"], {}, False),
        (["--ignore-integrity-check=true"], {}, False),
        ([], {"KRONK_CACHE_IGNORE_INTEGRITY_CHECK": "false"}, True),
        (["--ignore-integrity-check=false"], {INTEGRITY_VARIABLE: "false"}, False),
        (["--ignore-integrity-check=false", "--catalog-check-integrity=false"], {}, False),
        ([], {}, False),
    ],
)
def test_the_manual_s_switch_sets_the_setting_unless_it_is_set(
    arguments: list[str],
    environ: dict[str, str],
    expected: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What `kronk server start ARGS` would serve with (stopped before serving)."""
    seen: list[ServerSettings] = []
    monkeypatch.setattr(kronk_api.cli.server, "serve", seen.append)
    # Unset, then restored, by the runner: what the switch sets does not outlive the test.
    env = {INTEGRITY_VARIABLE: None, "KRONK_CACHE_IGNORE_INTEGRITY_CHECK": None, **environ}
    env["KRONK_BASE_PATH"] = str(tmp_path)
    result = CliRunner().invoke(main, ["server", "start", *arguments], env=env)
    assert result.exit_code == 0, result.output
    assert SETTINGS.of(seen[0]).check_integrity is expected
    assert INTEGRITY_VARIABLE not in os.environ
