"""The llamacpp Backend: GGUF files, the packaged models, llama.cpp's devices; loads a GGUF as
a text model or, by its metadata, an embedding model."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import llama_cpp

from kronk_core.contract import (
    ConfigError,
    Device,
    EmbeddingModel,
    MemoryEstimate,
    ModelConfig,
    ModelFacts,
    ModelFile,
    ModelLoadError,
    PackagedModel,
    StrategyModel,
)
from kronk_llamacpp.devices import list_devices
from kronk_llamacpp.embedding import LlamaEmbeddingModel, pooling_of
from kronk_llamacpp.estimate import choose_context, estimate, refuse_if_too_large
from kronk_llamacpp.facts import model_facts
from kronk_llamacpp.files import describe, is_gguf
from kronk_llamacpp.gguf_meta import read_metadata
from kronk_llamacpp.model import LlamaTextModel
from kronk_llamacpp.packaged import PACKAGED_MODELS
from kronk_llamacpp.rpc import add_servers
from kronk_llamacpp.settings import SETTINGS
from kronk_llamacpp.weights import load_weights, metadata

log = logging.getLogger(__name__)


def _loads(config: ModelConfig) -> bool:
    return config.model_path is not None and is_gguf(config.model_path)


class LlamaCppBackend:
    """Registered as "llamacpp", the default backend; it loads `.gguf` files only."""

    def model_file(self, path: Path) -> ModelFile | None:
        return describe(path)

    def packaged_models(self) -> Sequence[PackagedModel]:
        return list(PACKAGED_MODELS.values())

    def devices(self) -> Sequence[Device]:
        return list_devices()

    def memory_estimate(self, config: ModelConfig) -> MemoryEstimate | None:
        return estimate(config, list_devices()) if _loads(config) else None

    def model_facts(self, config: ModelConfig) -> ModelFacts | None:
        return model_facts(config) if _loads(config) else None

    def load_model(self, config: ModelConfig) -> StrategyModel | EmbeddingModel:
        if not _loads(config):
            raise ModelLoadError(
                f"the llamacpp backend loads .gguf files, not {config.model_path} (set "
                f"{config.section_key('backend')} to the backend that loads it)"
            )
        servers = SETTINGS.of(config).rpc_servers
        if servers:
            add_servers(servers)  # their devices join the list the estimate places on
        devices = list_devices()
        if config.context_window is None:
            assert config.model_path is not None
            meta = read_metadata(config.model_path)
            choice = choose_context(config, devices, meta, config.model_path.stat().st_size)
            log.info("%s: context_window unset: %s", config.id, choice.describe())
            config = config.model_copy(update={"context_window": choice.tokens})
        # Refused before llama.cpp allocates anything when it cannot fit.
        refuse_if_too_large(config, estimate(config, devices))
        weights = load_weights(config)
        try:
            pooling = pooling_of(metadata(weights))
        except BaseException:
            llama_cpp.llama_model_free(weights)
            raise
        # Each class owns the weights from here on and frees them if it fails.
        if pooling is not None and config.lora:
            llama_cpp.llama_model_free(weights)
            raise ConfigError(
                config.section_key("lora"), "LoRA adapters apply to text models, not embeddings"
            )
        if pooling is not None:
            return LlamaEmbeddingModel(config, weights, pooling)
        if config.projector_path is not None:
            # Imported on first use: it loads llama.cpp's multimodal library.
            from kronk_llamacpp.media import LlamaMediaModel

            return LlamaMediaModel(config, weights)
        return LlamaTextModel(config, weights)
