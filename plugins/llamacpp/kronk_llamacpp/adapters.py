"""LoRA adapters: loaded with a model's weights, applied to the decodes the engine asks for."""

from __future__ import annotations

import ctypes

import llama_cpp

from kronk_core.contract import AdapterInfo, Adapters, ConfigError, ModelConfig
from kronk_llamacpp.library import errors_logged


class LoraAdapters:
    """A model's adapters, in the order its config lists them (their ids). llama.cpp frees
    them with the weights."""

    def __init__(self, weights: llama_cpp.llama_model_p, config: ModelConfig) -> None:
        self._pointers: list[llama_cpp.llama_adapter_lora_p] = []
        for index, adapter in enumerate(config.lora):
            key = config.section_key(f"lora.{index}.path")
            with errors_logged() as errors:
                pointer = llama_cpp.llama_adapter_lora_init(weights, str(adapter.path).encode())
            if not pointer:
                # The last line llama.cpp logged, less the name of the function that logged it.
                why = errors[-1].partition(": ")[2] if errors else "not a LoRA adapter GGUF?"
                raise ConfigError(
                    key, f"llama.cpp could not load {adapter.path} as an adapter of it: {why}"
                )
            self._pointers.append(pointer)
            if llama_cpp.llama_adapter_get_alora_n_invocation_tokens(pointer):
                raise ConfigError(key, "activated LoRA (aLoRA) adapters are not supported")
        self.info = tuple(
            AdapterInfo(index, str(adapter.path), adapter.scale)
            for index, adapter in enumerate(config.lora)
        )
        self._applied: Adapters = ()

    def apply(self, ctx: llama_cpp.llama_context_p, adapters: Adapters) -> None:
        """Make the context's decodes apply exactly these adapters."""
        if adapters == self._applied:
            return
        count = len(adapters)
        pointers = (llama_cpp.llama_adapter_lora_p_ctypes * count)(
            *(self._pointers[index] for index, _ in adapters)
        )
        scales = (ctypes.c_float * count)(*(scale for _, scale in adapters))
        llama_cpp.llama_set_adapters_lora(ctx, pointers, count, scales)
        self._applied = adapters
