"""Tiny test models generated with the `gguf` package, cached across sessions.

Each module makes one kind (scripts/ holds their command lines). This file imports nothing,
so that the pytest plugin can name the recurrent models' files when it is loaded.
"""

TINY_LFM2 = "tiny-lfm2.gguf"
TINY_LFM2_SWA = "tiny-lfm2-swa.gguf"
TINY_MAMBA2 = "tiny-mamba2.gguf"
