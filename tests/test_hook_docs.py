"""docs/plugins.md states every hook spec's signature, as the spec has it (as datasette checks),
and every hook spec has a test of its own, `test_hook_<name>` (tests/test_hooks.py has them):
a small plugin implementing just that hook, registered in-process, its effect asserted."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kronk_core.contract.plugins import create_plugin_manager

# The installed plugins' hook specs are documented too.
pytestmark = pytest.mark.needs_plugins

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
TEST_FOLDERS = [ROOT / "tests", *sorted(ROOT.glob("plugins/*/tests"))]
# The core's hooks, and those the installed plugins define for other plugins (added in their
# kronk_addhooks): found through the plugin manager, never listed here.
SPEC_MODULES: list[ModuleType] = sorted(
    {
        caller.spec.namespace
        for caller in vars(create_plugin_manager().hook).values()
        if caller.spec is not None and isinstance(caller.spec.namespace, ModuleType)
    },
    key=lambda module: module.__name__,
)
DOCUMENTED = re.compile(r"^### `(kronk_\w+)\(", re.MULTILINE)


def specs() -> Iterator[tuple[str, Callable[..., Any]]]:
    for module in SPEC_MODULES:
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("kronk_") and hasattr(function, "kronk_spec"):
                yield name, function


def heading(function: Callable[..., Any]) -> str:
    """The heading the docs must have: the signature as written in the spec."""
    signature = inspect.signature(function)  # annotations stay strings (postponed)
    parameters = ", ".join(
        f"{parameter.name}: {parameter.annotation}" for parameter in signature.parameters.values()
    )
    text = f"### `{function.__name__}({parameters}) -> {signature.return_annotation}`"
    return text + (" (firstresult)" if function.kronk_spec["firstresult"] else "")


@pytest.mark.parametrize(("name", "function"), list(specs()), ids=[name for name, _ in specs()])
def test_every_hook_spec_is_documented_with_its_signature(
    name: str, function: Callable[..., Any]
) -> None:
    expected = heading(function)
    documented = [line for line in DOCS.splitlines() if line.startswith(f"### `{name}(")]
    assert documented == [expected], f"docs/plugins.md must have exactly: {expected}"


def test_the_spec_modules_are_found() -> None:
    names = {module.__name__ for module in SPEC_MODULES}
    assert {
        "kronk_core.contract.hookspecs",
        "kronk_templates.hookspecs",
        "kronk_debug.hookspecs",
    } <= names


def test_every_documented_hook_has_a_spec() -> None:
    assert set(DOCUMENTED.findall(DOCS)) == {name for name, _ in specs()}


def hooks_with_a_test() -> set[str]:
    """The hooks named by a `test_hook_<name>` function in any test folder."""
    named = set()
    for folder in TEST_FOLDERS:
        for path in folder.rglob("test_*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                if is_function and node.name.startswith("test_hook_"):
                    named.add(node.name.removeprefix("test_hook_"))
    return named


@pytest.mark.parametrize("name", [name for name, _ in specs()])
def test_every_hook_spec_has_a_test_of_its_own(name: str) -> None:
    assert name in hooks_with_a_test(), (
        f"write test_hook_{name} (tests/test_hooks.py): a small plugin implementing just "
        f"{name}, registered in-process, and what it changes asserted"
    )
