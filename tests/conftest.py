"""The project's own test settings: the fuzz budget. Fixtures come from the harness
(kronk_testing.plugin, pytest's `kronk` plugin), as for any plugin's tests."""

from __future__ import annotations

from collections.abc import Callable
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
