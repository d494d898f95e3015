"""Modules that moved keep their old path for one release: importing it warns once, naming
the new path, and gives the new module itself. Nothing in the repository uses an old path.

The old paths are read from the shims (`moved(__name__, "kronk_core.<new>")`), never listed.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Where the repository's own code and manual are (the shims aside).
OWN = ["kronk_core", "kronk_api", "plugins", "examples", "tests", "bench", "scripts", "docs"]


def shims() -> dict[str, str]:
    """Old module → new module, from each shim's call to `moved`."""
    found = {}
    for path in sorted((ROOT / "kronk_core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "moved"
                and isinstance(node.args[1], ast.Constant)
            ):
                old = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                found[old] = node.args[1].value
    return found


SHIMS = shims()


def test_the_shims_are_found() -> None:
    assert {
        "kronk_core.engine": "kronk_core.runtime.engine",
        "kronk_core.events": "kronk_core.records",
        "kronk_core.slots": "kronk_core.contract.cache",
        "kronk_core.models": "kronk_core.settings.model_files",
    }.items() <= SHIMS.items()


@pytest.mark.parametrize(("old", "new"), sorted(SHIMS.items()))
def test_an_old_path_warns_once_and_is_the_new_module(old: str, new: str) -> None:
    module = importlib.import_module(new)
    saved = sys.modules.pop(old, None)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first = importlib.import_module(old)
            again = importlib.import_module(old)
        assert first is module and again is module
        package, _, name = old.rpartition(".")
        assert getattr(importlib.import_module(package), name) is module
        assert [(w.category, str(w.message)) for w in caught] == [
            (DeprecationWarning, f"{old} moved to {new}; the old path goes in the next release")
        ]
        assert caught[0].filename != str(ROOT / "kronk_core" / "_moved.py")
    finally:
        if saved is not None:
            sys.modules[old] = saved


def test_the_warning_points_at_the_import() -> None:
    """A warning filter by module, or the warning's line, finds the code to change."""
    old = "kronk_core.events"
    saved = sys.modules.pop(old, None)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            exec(compile(f"import {old}\n", __file__, "exec"), {})
        assert [w.filename for w in caught] == [__file__]
    finally:
        if saved is not None:
            sys.modules[old] = saved


def test_monkeypatching_an_old_path_patches_the_new_module(monkeypatch: pytest.MonkeyPatch) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.import_module("kronk_core.engine")
    monkeypatch.setattr(old, "_IDLE_WAIT_SECONDS", 7.0)
    assert importlib.import_module("kronk_core.runtime.engine")._IDLE_WAIT_SECONDS == 7.0


def _own_files(suffix: str) -> list[Path]:
    shim_files = {ROOT / (old.replace(".", "/") + ".py") for old in SHIMS}
    return [
        path
        for folder in OWN
        for path in sorted((ROOT / folder).rglob(f"*{suffix}"))
        if path not in shim_files and path != Path(__file__) and not _built(path)
    ]


def _built(path: Path) -> bool:
    """Copies that builds and installs leave in the tree (ignored by git)."""
    return any(
        part in {".nox", "build", "__pycache__"} or part.endswith(".egg-info")
        for part in path.parts
    )


def test_no_code_imports_an_old_path() -> None:
    found = []
    for path in _own_files(".py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n in SHIMS]
    assert not found, "\n".join(found)


def test_no_page_or_string_names_an_old_path() -> None:
    """Docs, logger names and strings in code use the new paths (`kronk_core.events.x`,
    `kronk_core/events.py`)."""
    olds = "|".join(re.escape(old.removeprefix("kronk_core.")) for old in SHIMS)
    pattern = re.compile(rf"\bkronk_core[./]({olds})\b(?!_)")
    found = [
        f"{path.relative_to(ROOT)}: {match[0]}"
        for suffix in (".py", ".md", ".toml")
        for path in [*_own_files(suffix), ROOT / "README.md", ROOT / "pyproject.toml"]
        if path.suffix == suffix
        for match in pattern.finditer(path.read_text(encoding="utf-8"))
    ]
    assert not found, "\n".join(found)
