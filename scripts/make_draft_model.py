"""Make a draft model for speculative decoding: the default Gemma 3 270M, requantized.

The code is kronk_testing.models.draft (the test harness); this is its command line.

Usage: python scripts/make_draft_model.py [--out DIR]
"""

from kronk_testing.models.draft import GEMMA_DRAFT, make_gemma_draft
from kronk_testing.models.output import main

if __name__ == "__main__":
    main(__doc__, GEMMA_DRAFT, make_gemma_draft)
