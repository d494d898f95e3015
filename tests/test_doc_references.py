"""What the manual names in backticks exists in the code.

A `kronk_*` dotted name is an importable module or an attribute of one
(`kronk_core.runtime.engine.Engine._step`, a dataclass or protocol field included), an
entry point's `module:attribute` (`kronk_llamacpp.native:load`), or, written with
slashes, a file or folder of the core or of a plugin (`kronk_core/runtime/engine.py`).
A repository path (`tests/test_hooks.py`) exists, and `path::name` names a
function defined in that file. Placeholders (`plugins/<name>/`) are skipped.
No model is loaded: modules are imported, nothing is called.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path
from typing import Any

import pytest

# The pages name the plugins' code, which only an installed plugin has.
pytestmark = pytest.mark.needs_plugins

ROOT = Path(__file__).resolve().parents[1]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`([^`\n]+)`")
# A dotted or slashed kronk_* name, with call arguments after it allowed: `subject_of(request)`.
KRONK_NAME = re.compile(r"(kronk_\w+[./:][\w./:]*?)/?(?:\(.*\))?")
REPO_PATH = re.compile(r"((?:tests|plugins|examples|bench|scripts|docs)/[\w./*-]*)(?:::(\w+))?")


def references(page: Path) -> list[str]:
    text = FENCED.sub("", page.read_text(encoding="utf-8"))
    return [span.strip() for span in SPAN.findall(text)]


def _import(dotted: str) -> tuple[Any, list[str]]:
    """The longest importable module at the start of `dotted`, and the names after it."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        try:
            return importlib.import_module(name), parts[end:]
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if not (name == missing or name.startswith(missing + ".")):
                raise  # the module exists, but one of its own imports is missing
    raise AssertionError(f"no module {parts[0]!r}")


def _member(owner: Any, name: str) -> Any:
    """`owner.name`; a field known only by its declaration (a dataclass field with a factory,
    a pydantic field, a protocol's annotation) stands for itself."""
    if hasattr(owner, name):
        return getattr(owner, name)
    if dataclasses.is_dataclass(owner) and name in {f.name for f in dataclasses.fields(owner)}:
        return name
    if name in getattr(owner, "model_fields", {}):
        return name
    for cls in getattr(owner, "__mro__", ()):
        if name in vars(cls).get("__annotations__", {}):
            return name
    raise AssertionError(f"{owner!r} has no {name!r}")


def resolve_kronk_name(name: str) -> None:
    if "/" in name:
        found = [ROOT / name, *(folder / name for folder in (ROOT / "plugins").iterdir())]
        assert any(path.exists() for path in found), f"no file or folder {name}"
        return
    module, _, attribute = name.partition(":")
    owner, rest = _import(module)
    for part in [*rest, *filter(None, attribute.split("."))]:
        owner = _member(owner, part)


def resolve_repo_path(path: str, function: str | None) -> None:
    matches = list(ROOT.glob(path.rstrip("/"))) if "*" in path else [ROOT / path]
    assert matches and all(match.exists() for match in matches), f"no {path}"
    if function is not None:
        source = matches[0].read_text(encoding="utf-8")
        assert re.search(rf"^(async )?def {function}\(", source, re.MULTILINE), (
            f"{path} defines no {function}"
        )


def cited(page: Path) -> list[str]:
    return [
        span
        for span in references(page)
        if "<" not in span and (KRONK_NAME.fullmatch(span) or REPO_PATH.fullmatch(span))
    ]


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_every_name_the_page_cites_exists(page: Path) -> None:
    missing = []
    for span in cited(page):
        try:
            if match := KRONK_NAME.fullmatch(span):
                resolve_kronk_name(match[1])
            elif match := REPO_PATH.fullmatch(span):
                resolve_repo_path(match[1], match[2])
        except AssertionError as exc:
            missing.append(f"`{span}`: {exc}")
    assert not missing, f"{page.name} cites what the code lacks:\n" + "\n".join(missing)


def test_the_references_are_found() -> None:
    """The extraction finds each kind, so a page whose names all went unread cannot pass."""
    spans = set(cited(ROOT / "docs" / "architecture.md"))
    assert {
        "kronk_core.runtime.engine",
        "kronk_openai.routes.chat_completions",
        "kronk_core.contract.cache.CacheStrategy",
        "tests/test_core_neutral.py",
        "tests/test_hooks.py::test_server_hooks",
    } <= spans
    assert "kronk_llamacpp.native:load" in cited(ROOT / "docs" / "plugins.md")
    assert "kronk_core/contract/backend.py" in cited(ROOT / "docs" / "plugins.md")


@pytest.mark.parametrize(
    "name",
    [
        "kronk_core.runtime.engine.Nothing",
        "kronk_nothing.engine",
        "kronk_core/nothing.py",
        "kronk_llamacpp.native:nothing",
        "kronk_core.contract.cache.Slot.nothing",
    ],
)
def test_a_name_the_code_lacks_is_caught(name: str) -> None:
    with pytest.raises(AssertionError):
        resolve_kronk_name(name)


def test_a_test_the_file_lacks_is_caught() -> None:
    with pytest.raises(AssertionError):
        resolve_repo_path("tests/test_hooks.py", "test_nothing")
    with pytest.raises(AssertionError):
        resolve_repo_path("tests/test_nothing.py", None)
