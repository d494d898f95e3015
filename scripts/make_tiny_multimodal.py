"""Generate a tiny multimodal model for tests: a text model plus vision and audio projectors.

The code is kronk_testing.models.multimodal (the test harness); this is its command line.

Usage: python scripts/make_tiny_multimodal.py [--out DIR]
"""

from kronk_testing.models.multimodal import TINY_MM_LLAMA, make_tiny_multimodal
from kronk_testing.models.output import main

if __name__ == "__main__":
    main(__doc__, TINY_MM_LLAMA, make_tiny_multimodal)
