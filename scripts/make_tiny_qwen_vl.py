"""Generate a tiny Qwen2.5-VL-shaped model for tests: a `qwen2vl` text model and its projector.

The code is kronk_testing.models.qwen_vl (the test harness); this is its command line.

Usage: python scripts/make_tiny_qwen_vl.py [--out DIR]
"""

from kronk_testing.models.output import main
from kronk_testing.models.qwen_vl import TINY_QWEN_VL, make_tiny_qwen_vl

if __name__ == "__main__":
    main(__doc__, TINY_QWEN_VL, make_tiny_qwen_vl)
