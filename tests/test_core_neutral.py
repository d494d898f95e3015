"""The core names no plugin: no import of one, no string that is a built-in plugin's name,
settings section or registered name, no file format a backend owns.

Read from the plugins' sources, so it runs with the core alone. Docstrings and comments may
name built-ins as examples; code may not depend on them.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = sorted((ROOT / "kronk_core").rglob("*.py"))
PLUGINS = sorted(path.parent for path in (ROOT / "plugins").glob("*/pyproject.toml"))
SECTION_TYPES = {"ServerSection", "ModelSection"}
# Words the core gives a meaning of its own, which built-ins also use as names:
# `draft_strategy: none` turns speculation off and drafts are the engine's; `sampling` is a
# core key of every model and `embeddings` a model capability.
CORE_WORDS = {"none", "draft", "sampling", "embeddings"}
# What a backend's files are: the core must not know model file formats.
FORMATS = {"gguf", "mmproj"}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _strings(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.value


def _first_string_args(path: Path, names: set[str]) -> Iterator[str]:
    """The first argument of each call to a function named in `names`, where it is a string."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        first = node.args[0]
        if called in names and isinstance(first, ast.Constant) and isinstance(first.value, str):
            yield first.value


def built_in_names() -> tuple[set[str], set[str], set[str]]:
    """Plugins' names (entry points, distributions), section keys, and registered names."""
    names, sections, registered = set(), set(), set()
    for folder in PLUGINS:
        project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
        names.add(project["name"])
        names.update(project.get("entry-points", {}).get("kronk", {}))
        for source in folder.rglob("kronk_*/**/*.py"):
            sections.update(_first_string_args(source, SECTION_TYPES))
            registered.update(_first_string_args(source, {"register"}))
    return names - CORE_WORDS, sections - CORE_WORDS, registered - CORE_WORDS


def test_the_plugins_names_are_read() -> None:
    names, sections, registered = built_in_names()
    assert {"llamacpp", "kronk-caching", "templates"} <= names
    assert {"llamacpp", "caching", "templates", "speculative"} <= sections
    assert {"imc", "spc", "jinja", "lookup", "sqlite"} <= registered


def test_the_core_names_no_plugin() -> None:
    names, sections, registered = built_in_names()
    packages = {f"kronk_{folder.name.replace('-', '_')}" for folder in PLUGINS}
    words = re.compile(r"\b(" + "|".join(map(re.escape, registered | FORMATS)) + r")\b", re.I)
    found = []
    for path in CORE:
        where = path.relative_to(ROOT)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                    node.module or ""
                ]
                found += [f"{where}: imports {m}" for m in modules if m.split(".")[0] in packages]
        for text in _strings(path):
            if text in names | sections:
                found.append(f"{where}: {text!r} is a built-in plugin's name or section")
            elif (match := words.search(text)) is not None:
                found.append(f"{where}: {text!r} names {match[0]!r}")
    assert not found, "\n".join(found)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path) for path in CORE}


def _module_imports(path: Path) -> set[str]:
    """The core modules a module imports at its top level, `if TYPE_CHECKING:` included
    (a lazy import inside a function, such as a moved name's shim, is not a dependency)."""
    found = set()
    body = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.If):
            body += node.body + node.orelse
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kronk_core":
            # `from kronk_core.settings import spellings` imports a module
            submodules = {f"{node.module}.{alias.name}" for alias in node.names}
            found.update(submodules & MODULES or {node.module or ""})
    return found


def test_the_core_has_no_import_circle() -> None:
    graph = {_module_name(path): _module_imports(path) for path in CORE}
    graph = {module: imports - {"kronk_core"} for module, imports in graph.items()}
    graph.pop("kronk_core")
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        assert module not in path, " -> ".join([*path[path.index(module) :], module])
        if module in done or module not in graph:
            return
        for imported in sorted(graph[module]):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
