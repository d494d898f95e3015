"""Generate a tiny cross-encoder reranker GGUF for tests (run once; the output is cached).

The code is kronk_testing.models.reranker (the test harness); this is its command line.

Usage: python scripts/make_tiny_reranker.py [--out DIR]
"""

from kronk_testing.models.output import main
from kronk_testing.models.reranker import TINY_RERANKER, make_tiny_reranker

if __name__ == "__main__":
    main(__doc__, TINY_RERANKER, make_tiny_reranker)
