"""Finding markers in streamed text, and holding back what may still become one."""

from __future__ import annotations

from collections.abc import Iterable


def held_prefix(text: str, markers: Iterable[str]) -> int:
    """Length of the longest end of `text` that is the start of a marker (it may grow into one)."""
    best = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:size]):
                best = size
                break
    return best


def find_first(text: str, markers: Iterable[str]) -> tuple[int, str] | None:
    """The earliest marker in `text` and where it starts (the longest one on a tie)."""
    found: tuple[int, str] | None = None
    for marker in markers:
        at = text.find(marker)
        if at >= 0 and (found is None or (at, -len(marker)) < (found[0], -len(found[1]))):
            found = (at, marker)
    return found
