"""Convert the real all-MiniLM-L6-v2 checkpoint into a BERT GGUF (run once; the output is cached).

The code is kronk_testing.models.minilm (the test harness); this is its command line.

Usage: python scripts/convert_minilm.py [--out DIR]
"""

from kronk_testing.models.minilm import MINILM, checkpoint_dir, convert
from kronk_testing.models.output import main

if __name__ == "__main__":
    main(__doc__, MINILM, lambda path: convert(checkpoint_dir(path.parent), path))
