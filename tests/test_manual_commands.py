"""Every `kronk ...` command line of the Kronk manual's chapters 2, 7 and 12 parses here.

The lines were taken from the manual once and live in tests/data/manual_commands.txt, each
group under the chapter and section it came from (the file's header says how).

Each runs with `--help` appended, in process (click's parser checks every option before
`--help` acts, so nothing else runs): an unknown command or option, or a value given to
a flag that takes none, fails the test. What Kronk cannot do is in UNSUPPORTED and in
docs/cli.md ("The manual's commands"), with why.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import kronk_api.cli.server
from kronk_api.cli import main
from kronk_api.settings import ServerSettings

ROOT = Path(__file__).resolve().parents[1]
MANUAL_COMMANDS = ROOT / "tests" / "data" / "manual_commands.txt"
DOCS = ROOT / "docs" / "cli.md"

# Options of the manual that Kronk does not take, each listed in docs/cli.md with why.
UNSUPPORTED = {"--lib-version", "--catalog-repo-path"}
# Variables the commands set for the process (--processor, --lib-path, --hf-token, ...):
# restored after each run.
PROCESS_VARIABLES = {
    name: None
    for name in (
        "KRONK_PROCESSOR",
        "KRONK_LIB_PATH",
        "KRONK_CATALOG_HF_TOKEN",
        "KRONK_LLAMA_LOG",
        "KRONK_CATALOG_SOURCE",
        "KRONK_CATALOG_TEMPLATES_SOURCE",
        "LLAMA_CPP_LIB_PATH",
    )
}


def manual_sections() -> dict[str, list[str]]:
    """The data file's command lines by the "## chapter / section" heading they came from."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in MANUAL_COMMANDS.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            current = sections.setdefault(line.removeprefix("## "), [])
        elif line and not line.startswith("#"):
            assert current is not None, f"a command before any section heading: {line}"
            current.append(line)
    return sections


def manual_commands() -> list[str]:
    return [command for commands in manual_sections().values() for command in commands]


COMMANDS = manual_commands()


def test_the_manual_has_the_commands() -> None:
    """The data file holds the chapters' commands, each under its chapter and section."""
    sections = manual_sections()
    assert len(COMMANDS) >= 30
    assert all(command.split()[0] == "kronk" for command in COMMANDS)
    for heading in sections:
        assert heading.startswith(("Chapter 2: ", "Chapter 7: ", "Chapter 12: ")), heading
    runtime = sections["Chapter 7: Model Server / 7.9 Runtime Settings"]
    assert "kronk server start --processor=cuda" in runtime
    for expected in (
        "kronk catalog list --local",
        "kronk catalog pull Qwen3-8B-Q8_0 --local",
        "kronk libs --local",
        "kronk server start --processor=cuda",
        "kronk server start --hf-token=hf_xxxxx",
        "kronk server start --insecure-logging=true",
    ):
        assert expected in COMMANDS


def _run(words: list[str]) -> Any:
    return CliRunner().invoke(main, words, env=PROCESS_VARIABLES, catch_exceptions=False)


@pytest.mark.parametrize("command", COMMANDS)
def test_manual_command_parses(command: str) -> None:
    # The options Kronk does not take are left out; UNSUPPORTED's test says why.
    words = [w for w in shlex.split(command)[1:] if w.partition("=")[0] not in UNSUPPORTED]
    result = _run([*words, "--help"])
    for refusal in ("No such option", "No such command", "does not take a value"):
        assert refusal not in result.output, f"{command}: {result.output}"
    assert result.exit_code == 0, f"{command}: {result.output}"


def test_unsupported_options_are_the_manuals_and_documented() -> None:
    """Each option left out above is the manual's, refused here, and said in docs/cli.md."""
    written = " ".join(COMMANDS)
    documented = DOCS.read_text()
    for option in UNSUPPORTED:
        assert option in written
        assert f"`{option}`" in documented, option
        result = _run(["server", "start", f"{option}=x", "--help"])
        assert "No such option" in result.output


def _settings(monkeypatch: pytest.MonkeyPatch, *args: str, **env: str) -> ServerSettings:
    """What `kronk server start ARGS` would serve with: the stub stops before serving."""
    seen: list[ServerSettings] = []
    monkeypatch.setattr(kronk_api.cli.server, "serve", seen.append)
    result = CliRunner().invoke(main, ["server", "start", *args], env={**PROCESS_VARIABLES, **env})
    assert result.exit_code == 0, result.output
    return seen[0]


def test_boolean_flags_take_values(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _settings(monkeypatch, "--preload=true").preload is True
    assert _settings(monkeypatch, "--preload=0").preload is False
    assert _settings(monkeypatch, "--preload", "--preload=no").preload is False
    assert _settings(monkeypatch, "--no-preload=false").preload is True
    assert _settings(monkeypatch, "--insecure-logging=yes").insecure_logging is True
    # A plugin's section's flag, and the manual's deprecated spelling of it.
    auth = _settings(monkeypatch, "--auth-jwt-enabled=1").sections["auth-jwt"]
    assert auth.enabled is True
    auth = _settings(monkeypatch, "--auth-enabled=true").sections["auth-jwt"]
    assert auth.enabled is True
    result = CliRunner().invoke(main, ["server", "start", "--preload=maybe"])
    assert result.exit_code == 2
    assert "Invalid value for '--preload': 'maybe' is not a valid boolean" in result.output


def test_plain_flags_take_values() -> None:
    """A flag without a --no- form, a plugin's among them: =false leaves it out."""
    result = _run(["catalog", "list", "--json=true", "--local=1"])
    assert result.exit_code == 0 and result.output.lstrip().startswith("[")
    result = _run(["catalog", "list", "--json=false"])
    assert result.exit_code == 0 and result.output.startswith("CATALOG")


def test_timeouts_by_flag_and_by_the_manuals_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(monkeypatch, "--read-timeout=2m", "--write-timeout=90s")
    assert (settings.read_timeout, settings.write_timeout) == (120.0, 90.0)
    assert (settings.idle_timeout, settings.shutdown_timeout) == (60.0, 60.0)
    settings = _settings(
        monkeypatch, KRONK_WEB_IDLE_TIMEOUT="5s", KRONK_WEB_SHUTDOWN_TIMEOUT="1m30s"
    )
    assert (settings.idle_timeout, settings.shutdown_timeout) == (5.0, 90.0)
    # The rule's variable wins over the manual's.
    settings = _settings(monkeypatch, KRONK_WEB_READ_TIMEOUT="5s", KRONK_READ_TIMEOUT="7s")
    assert settings.read_timeout == 7.0


def test_hf_token_is_the_servers_token(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(monkeypatch, "--hf-token=hf_manual")
    assert settings.sections["catalog"].token() == "hf_manual"
    settings = _settings(monkeypatch, "--hf-token=hf_manual", "--catalog-hf-token=hf_rule")
    assert settings.sections["catalog"].token() == "hf_rule"


def test_processor_without_its_libraries_is_one_line(tmp_path: Path) -> None:
    """A processor whose libraries are not installed stops the start with one line that
    names the command installing them (in a process of its own: the choice is made
    before the plugins load)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "kronk_api.cli", "server", "start", "--processor=vulkan"],
        env={"KRONK_BASE_PATH": str(tmp_path), "KRONK_LIB_PATH": str(tmp_path / "libs")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: --processor: no vulkan llama.cpp libraries in ")
    assert "`kronk libs --processor vulkan`" in last


def test_the_manuals_catalog_repositories(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GitHub repository's page URL becomes its folder's contents-API listing; the
    rule's --catalog-source beats it."""
    settings = _settings(
        monkeypatch,
        "--catalog-github-repo=https://github.com/myorg/my-catalog",
        "--templates-github-repo=https://github.com/myorg/my-templates.git",
    ).sections["catalog"]
    assert settings.source == "https://api.github.com/repos/myorg/my-catalog/contents/catalogs"
    assert settings.templates_source == (
        "https://api.github.com/repos/myorg/my-templates/contents/templates"
    )
    settings = _settings(
        monkeypatch,
        "--catalog-github-repo=https://github.com/myorg/my-catalog",
        "--catalog-source=https://example.com/catalog.yaml",
    ).sections["catalog"]
    assert settings.source == "https://example.com/catalog.yaml"
