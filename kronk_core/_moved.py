"""Old module paths, kept for one release: each becomes its new module, with a warning."""

from __future__ import annotations

import importlib
import sys
import warnings


def moved(old: str, new: str) -> None:
    """Make module `old` the module `new` itself, so its private names and monkeypatching
    keep working, and warn the code that imported the old path (stacklevel: past this
    function and the old module, to the import statement)."""
    warnings.warn(
        f"{old} moved to {new}; the old path goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    sys.modules[old] = importlib.import_module(new)
