"""The hostile-input property tests (marked `fuzz`) run in one of two ways.

By default (CI) each runs its fixed regression corpus: its `@example` entries, then the
examples Hypothesis derives from the test's own code (`derandomize`), the same ones every
run, with no example database.

With KRONK_FUZZ_SECONDS set (`nox -s fuzz`) they explore: fresh random examples, round
after round, until the tests' shares of that many seconds are spent. An example that fails
is kept in .hypothesis/fuzz and tried first by every later exploring run until it passes;
it joins the corpus when its falsifying example is written into the test as an `@example`
entry (docs/install.md, "Fuzzing").

tests/conftest.py shares the budget among the selected fuzz tests (FuzzBudget) and gives
them the `explore` fixture; a test takes its settings from `fuzz_settings`.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase

FUZZ_SECONDS = "KRONK_FUZZ_SECONDS"
# Beside Hypothesis' own example database (.hypothesis/ in the folder pytest runs in).
DATABASE = Path(".hypothesis") / "fuzz"


def fuzz_seconds() -> float | None:
    """The exploring budget, or None for the corpus."""
    value = os.environ.get(FUZZ_SECONDS, "").strip()
    return float(value) if value else None


def fuzz_settings(key: str, **options: Any) -> settings:
    """Settings for one property test: the corpus, or exploring with the failures of earlier
    runs kept under `key` (a test's name, with its parameters)."""
    if fuzz_seconds() is None:
        return settings(derandomize=True, database=None, **options)
    folder = DATABASE / re.sub(r"[^A-Za-z0-9_.]+", "-", key).strip("-")
    return settings(
        derandomize=False,
        database=DirectoryBasedExampleDatabase(folder),
        print_blob=True,
        **options,
    )


@dataclass
class FuzzBudget:
    """KRONK_FUZZ_SECONDS shared by the selected fuzz tests in the order they run: each one
    explores until its share, counted from the first one's start, is spent. A test that
    overran leaves less to the rest, and every test runs at least one round."""

    seconds: float
    tests: int
    started: float | None = None
    finished: int = 0
    rounds: int = 0

    def explore(self, run: Callable[[], None]) -> None:
        if self.started is None:
            self.started = time.monotonic()
        deadline = self.started + self.seconds * (self.finished + 1) / self.tests
        try:
            while True:
                run()  # one Hypothesis run: a fresh random seed each time
                self.rounds += 1
                if time.monotonic() >= deadline:
                    return
        finally:
            self.finished += 1

    def summary(self) -> str:
        spent = 0.0 if self.started is None else time.monotonic() - self.started
        return (
            f"fuzz: {self.finished} of {self.tests} tests explored {self.rounds} rounds of "
            f"random examples in {spent:.0f} s ({FUZZ_SECONDS}={self.seconds:g}); "
            f"failing examples are kept in {DATABASE}"
        )
