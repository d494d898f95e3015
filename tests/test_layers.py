"""The house's floors: the core's wings import downward only, and plugins read the core and
the server through their fronts.

Wings, lowest first: `kronk_core.contract` (protocols, hook specs, value types, errors),
`kronk_core.settings` (configuration files, sections, model files), `kronk_core.runtime`
(engine, pool, loading), then the request path (the SDK facade and what it calls, the modules
at `kronk_core`'s top). An import under `if TYPE_CHECKING:` only names a type in annotations,
so it may look up a floor: the contract's signatures name settings' config models.

Plugins (every plugin package, the example plugin, kronk_testing) import `kronk_core` (the
SDK) and `kronk_core.contract` (the plugin API), `kronk_api` (the app) and
`kronk_api.contract` (what dialects use): any module behind those may move. Read from the
sources, so it runs with the core alone.
"""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import kronk_core.contract

ROOT = Path(__file__).resolve().parent.parent
WINGS = ("contract", "settings", "runtime")
REQUEST_PATH = len(WINGS)
FRONTS = {"kronk_core", "kronk_core.contract", "kronk_api", "kronk_api.contract"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    relative = Path(*name.split("."))
    return (ROOT / relative).with_suffix(".py").exists() or (ROOT / relative).is_dir()


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """Line numbers inside `if TYPE_CHECKING:` blocks."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING"
        ):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports(path: Path, *, typing_too: bool = False) -> Iterator[tuple[int, str]]:
    """(line, module) for each kronk module `path` imports at run time; `from a import b`
    where a.b is a module counts as importing a.b."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = set() if typing_too else _type_checking_blocks(tree)
    # The package a relative import starts from: the module's own, or the package itself.
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package.pop()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in typing_only:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = ".".join(package[: len(package) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                whole = f"{base}.{alias.name}"
                yield node.lineno, whole if is_module(whole) else base


def floor(module: str) -> int | None:
    """The wing of a core module, None for the contract's front (it names every floor)."""
    parts = module.split(".")
    if module == "kronk_core.contract":
        return None
    if len(parts) > 1 and parts[1] in WINGS:
        return WINGS.index(parts[1])
    return REQUEST_PATH


def core_modules() -> list[Path]:
    return sorted((ROOT / "kronk_core").rglob("*.py"))


def tracked(*folders: str) -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", *folders], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / name for name in listed if name.endswith(".py")]


def plugin_sources() -> list[Path]:
    """Every plugin's package (not its tests), the example plugin's, and kronk_testing."""
    return [
        path
        for path in tracked("plugins", "examples/kronk-example-plugin", "kronk_testing")
        if "tests" not in path.relative_to(ROOT).parts
    ]


def test_the_wings_are_read() -> None:
    found = {floor(module_name(path)) for path in core_modules()}
    assert found == {None, 0, 1, 2, REQUEST_PATH}
    assert len(plugin_sources()) > 100


def test_each_wing_imports_only_the_wings_below_it() -> None:
    upward = []
    for path in core_modules():
        own = floor(module_name(path))
        if own is None:
            continue
        for line, imported in imports(path):
            if not imported.startswith("kronk_core"):
                continue
            target = floor(imported)
            where = f"{path.relative_to(ROOT)}:{line} imports {imported}"
            if target is None:
                upward.append(f"{where} (the plugins' front; the core imports the module)")
            elif target > own:
                upward.append(where)
    assert not upward, "\n".join(upward)


def test_plugins_import_the_core_and_the_server_through_their_fronts() -> None:
    behind = sorted(
        {
            f"{path.relative_to(ROOT)}:{line} imports {imported}"
            for path in plugin_sources()
            for line, imported in imports(path, typing_too=True)
            if imported.split(".")[0] in {"kronk_core", "kronk_api"} and imported not in FRONTS
        }
    )
    assert not behind, "\n".join(behind)


def test_the_server_never_imports_its_own_front() -> None:
    front = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "kronk_api").rglob("*.py"))
        if path.name != "contract.py"
        for line, imported in imports(path, typing_too=True)
        if imported == "kronk_api.contract"
    ]
    assert not front, "\n".join(front)


def test_the_server_imports_no_plugin() -> None:
    """kronk_api reaches plugins through hooks and registries, as the core does."""
    packages = {f"kronk_{folder.name.replace('-', '_')}" for folder in (ROOT / "plugins").iterdir()}
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {imported}"
        for path in sorted((ROOT / "kronk_api").rglob("*.py"))
        for line, imported in imports(path, typing_too=True)
        if imported.split(".")[0] in packages
    ]
    assert not found, "\n".join(found)


def _typed_names(path: Path) -> dict[str, str]:
    """Name → module of the front's `if TYPE_CHECKING:` imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = _type_checking_blocks(tree)
    return {
        alias.asname or alias.name: node.module or ""
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.lineno in typing_only
        for alias in node.names
    }


def test_the_contract_front_names_what_it_hands_out() -> None:
    """Every name in `__all__` resolves, and the names it imports lazily (from the wings
    above) are the ones type checkers are shown."""
    front = ROOT / "kronk_core" / "contract" / "__init__.py"
    for name in kronk_core.contract.__all__:
        assert getattr(kronk_core.contract, name) is not None, name
    lazy = {name: module for module, names in kronk_core.contract.ABOVE.items() for name in names}
    assert _typed_names(front) == lazy
    assert set(lazy) <= set(kronk_core.contract.__all__)


def test_the_contract_front_fails_on_an_unknown_name() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        kronk_core.contract.no_such_name  # noqa: B018
