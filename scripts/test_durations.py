"""Where the suite's time goes: per-test durations from pytest's JUnit XML, summed by file.

`nox -s quick` and `nox -s full` write .reports/junit-quick.xml and .reports/junit-full.xml
(CI's run too); `nox -s durations` prints the table from whichever are there:

    file                                         tier    tests  seconds  share
    plugins/caching/tests/test_caching.py        full       50    449.5  17.1%
    ...

Run it directly to read other files: `python scripts/test_durations.py a.xml b.xml`.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

REPORTS = Path(__file__).resolve().parents[1] / ".reports"


@dataclass
class FileCost:
    tier: str
    tests: int = 0
    seconds: float = 0.0


def costs(reports: list[Path]) -> dict[tuple[str, str], FileCost]:
    """Each test file's tests and seconds per tier (a file may have tests in both); the tier
    is the report's (junit-<tier>.xml)."""
    by_file: dict[tuple[str, str], FileCost] = {}
    for report in reports:
        tier = report.stem.removeprefix("junit-")
        for case in ElementTree.parse(report).iter("testcase"):
            # classname is the module's dotted path (with --import-mode=importlib too).
            module = case.get("classname", "").split("::")[0]
            name = module.replace(".", "/") + ".py"
            cost = by_file.setdefault((name, tier), FileCost(tier))
            cost.tests += 1
            cost.seconds += float(case.get("time", "0"))
    return by_file


def table(by_file: dict[tuple[str, str], FileCost]) -> str:
    total = sum(cost.seconds for cost in by_file.values()) or 1.0
    rows = [f"{'file':<60}{'tier':<8}{'tests':>6}{'seconds':>10}{'share':>8}"]
    for (name, _), cost in sorted(by_file.items(), key=lambda item: -item[1].seconds):
        share = 100 * cost.seconds / total
        rows.append(f"{name:<60}{cost.tier:<8}{cost.tests:>6}{cost.seconds:>10.1f}{share:>7.1f}%")
    tiers: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for cost in by_file.values():
        tiers[cost.tier][0] += cost.tests
        tiers[cost.tier][1] += cost.seconds
    for tier, (tests, seconds) in sorted(tiers.items()):
        rows.append(f"{'total, ' + tier:<68}{int(tests):>6}{seconds:>10.1f}")
    return "\n".join(rows)


def main(arguments: list[str]) -> int:
    reports = [Path(argument) for argument in arguments] or sorted(REPORTS.glob("junit-*.xml"))
    if not reports:
        print(f"no JUnit reports in {REPORTS}: run nox -s quick or nox -s full first")
        return 1
    print(table(costs(reports)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
