"""Make a draft model for speculative decoding: the default Gemma 3 270M, requantized.

A draft must share its target's vocabulary; the same model at a lower-precision
quantization does, and agrees with it often enough to exercise both accepted and
rejected drafts. Made with llama.cpp's own quantizer (no download).

Command line: python scripts/make_draft_model.py [--out DIR]
"""

from __future__ import annotations

import os
from pathlib import Path

GEMMA_DRAFT = "gemma-3-270m-q4_0.gguf"


def make_gemma_draft(path: Path, ftype: int | None = None) -> Path:
    """Requantize the default model into `path` (Q4_0 unless `ftype` says otherwise)."""
    # Imported here: the core-only test session imports this module without llama.cpp.
    import llama_cpp

    from kronk_llamacpp.library import ensure_initialised
    from kronk_llamacpp.packaged import gemma_model_path

    ensure_initialised()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0 if ftype is None else ftype
    params.allow_requantize = True
    status = llama_cpp.llama_model_quantize(
        str(gemma_model_path()).encode(), str(partial).encode(), params
    )
    if status != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"llama_model_quantize failed with status {status}")
    partial.replace(path)
    return path
