"""Generate tiny GGUF models for tests (run once; the output is cached).

The code is kronk_testing.models.tiny (the test harness); this is its command line.

Usage: python scripts/make_tiny_models.py [--out DIR]
"""

from kronk_testing.models.output import main_all
from kronk_testing.models.tiny import TINY_FIM, TINY_LLAMA, make_tiny_fim, make_tiny_llama

if __name__ == "__main__":
    main_all(__doc__, {TINY_LLAMA: make_tiny_llama, TINY_FIM: make_tiny_fim})
