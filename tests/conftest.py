"""The project's own test settings: the fuzz budget, and which tests are the core's. Fixtures
come from the harness (kronk_testing.plugin, pytest's `kronk` plugin), as for any plugin's
tests."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from kronk_testing.fuzzing import FuzzBudget, fuzz_seconds

FUZZ_BUDGET = pytest.StashKey[FuzzBudget]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Exploring (KRONK_FUZZ_SECONDS set): share the budget among the selected fuzz tests."""
    seconds = fuzz_seconds()
    tests = sum(1 for item in session.items if item.get_closest_marker("fuzz"))
    if seconds is not None and tests:
        session.config.stash[FUZZ_BUDGET] = FuzzBudget(seconds, tests)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    budget = config.stash.get(FUZZ_BUDGET, None)
    if budget is not None:
        terminalreporter.write_line(budget.summary())


@pytest.fixture
def explore(request: pytest.FixtureRequest) -> Callable[[Callable[[], None]], None]:
    """Runs a fuzz test's Hypothesis test: once (its corpus), or, when exploring, round after
    round until the test's share of KRONK_FUZZ_SECONDS is spent (kronk_testing.fuzzing)."""
    assert request.node.get_closest_marker("fuzz"), "explore is for tests marked fuzz"
    budget = request.config.stash.get(FUZZ_BUDGET, None)
    if budget is None:
        return lambda run: run()
    return budget.explore


# ---- the core's tests: `pytest -m core tests` (nox -s core), without any plugin ----------
# Found from each module's imports and its tests' fixtures; what a module needs only at run
# time (entry points, docs naming the plugins' code, a subprocess on the default model) it
# says with `pytestmark = pytest.mark.needs_plugins`.

CORE = "core"
NEEDS_PLUGINS = "needs_plugins"
TESTS = Path(__file__).resolve().parent
HARNESS = TESTS.parent / "kronk_testing"


def _imports(tree: ast.AST) -> set[str]:
    """Every module `tree` imports, anywhere (in functions and under TYPE_CHECKING too)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def needs_a_plugin(module: str, seen: frozenset[str] = frozenset()) -> bool:
    """Whether importing `module` needs a plugin, or what the installed plugins compose:
    llama_cpp, a `kronk_*` package other than the core (a plugin, or kronk_api, whose server
    and CLI are made of the installed plugins' routes, options and sections), or a harness
    module that imports one of those."""
    top = module.split(".")[0]
    if top == "kronk_core" or not top.startswith(("kronk_", "llama_cpp")):
        return False
    if top != "kronk_testing":
        return True
    if module in seen:  # an import cycle among harness modules
        return False
    relative = Path(*module.split(".")[1:])
    sources = [HARNESS / relative / "__init__.py"]
    if module != top:
        sources.append(HARNESS / relative.with_suffix(".py"))
    for source in sources:
        if source.is_file():
            imported = _imports(ast.parse(source.read_text(encoding="utf-8")))
            return any(needs_a_plugin(name, seen | {module}) for name in imported)
    return False  # a name imported from a harness module, not a module of its own


def _any_needs_a_plugin(modules: Iterable[str]) -> bool:
    return any(needs_a_plugin(module) for module in modules)


@cache
def _fixture_needs_a_plugin(function: Callable[..., Any]) -> bool:
    """Whether a fixture's own code imports a plugin, directly or through a function of its
    module that it calls (the harness's fixtures import what they need when they run)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    if _any_needs_a_plugin(_imports(tree)):
        return True
    module = inspect.getmodule(function)
    called = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    helpers = [getattr(module, name, None) for name in called]
    return any(
        inspect.isfunction(helper)
        and helper is not function
        and inspect.getmodule(helper) is module
        and _fixture_needs_a_plugin(helper)
        for helper in helpers
    )


@cache
def _module_is_core(path: Path) -> bool:
    return not _any_needs_a_plugin(_imports(ast.parse(path.read_text(encoding="utf-8"))))


def _selects_core(config: pytest.Config) -> bool:
    return str(config.getoption("markexpr", "")).strip() == CORE


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Selecting the core's tests, a module that imports a plugin is not even imported (the
    core session has no plugin to import)."""
    if (
        _selects_core(config)
        and collection_path.name.startswith("test_")
        and collection_path.suffix == ".py"
        and not _module_is_core(collection_path)
    ):
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `core` the tests whose module imports nothing but the core and the harness,
    whose fixtures need no plugin either (the session-wide model, ...), and that do not say
    they read the installed plugins at run time (marked `needs_plugins`)."""
    for item in items:
        if not isinstance(item, pytest.Function) or not item.path.is_relative_to(TESTS):
            continue
        if not _module_is_core(item.path) or item.get_closest_marker(NEEDS_PLUGINS):
            continue
        definitions = item._fixtureinfo.name2fixturedefs.values()
        if not any(
            _fixture_needs_a_plugin(definition.func)
            for chain in definitions
            for definition in chain
            if Path(inspect.getfile(definition.func)).is_relative_to(HARNESS)
        ):
            item.add_marker(CORE)
