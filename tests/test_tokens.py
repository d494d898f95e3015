"""Token-sequence arithmetic shared by the cache and draft strategies."""

from __future__ import annotations

import pytest

from kronk_core.contract.tokens import common_prefix


@pytest.mark.parametrize(
    ("a", "b", "shared"),
    [
        ([], [1, 2], 0),
        ([1, 2, 3], [1, 2, 3], 3),
        ([1, 2, 3], [1, 2, 3, 4], 3),
        ([1, 2, 3, 4], [1, 2, 9, 4], 2),
        ([5], [6], 0),
        (list(range(5000)), [*range(4321), -1, *range(4322, 5000)], 4321),
        ((1, 2, 3), [1, 2, 4], 2),  # a tuple and a list compare by their tokens
    ],
)
def test_common_prefix(a: list[int], b: list[int], shared: int) -> None:
    assert common_prefix(a, b) == shared
    assert common_prefix(b, a) == shared
