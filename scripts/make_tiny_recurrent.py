"""Generate tiny models whose state cannot be cut back, for tests (the output is cached).

The code is kronk_testing.models.recurrent (the test harness); this is its command line.

Usage: python scripts/make_tiny_recurrent.py [--out DIR]
"""

from kronk_testing.models.output import main_all
from kronk_testing.models.recurrent import MAKERS

if __name__ == "__main__":
    main_all(__doc__, MAKERS)
