"""Moved to `kronk_core.contract.cache`.

This old path works for one more release, with a warning.
"""

from kronk_core._moved import moved

moved(__name__, "kronk_core.contract.cache")
