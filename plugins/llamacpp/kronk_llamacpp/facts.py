"""What a GGUF file says about its model, from its header (`kronk model list` and `show`)."""

from __future__ import annotations

import llama_cpp

from kronk_core.contract import ModelConfig, ModelFacts
from kronk_llamacpp.files import model_parts
from kronk_llamacpp.gguf_meta import parameter_count, read_metadata

# `general.file_type` by the names of the llama.cpp this backend loads: 15 is Q4_K_M.
FILE_TYPES = {
    value: name.removeprefix("LLAMA_FTYPE_").removeprefix("MOSTLY_").removeprefix("ALL_")
    for name, value in vars(llama_cpp).items()
    if name.startswith("LLAMA_FTYPE_") and name != "LLAMA_FTYPE_GUESSED"
}


def model_facts(model_config: ModelConfig) -> ModelFacts:
    assert model_config.model_path is not None  # resolved before the hook is called
    files = model_parts(model_config.model_path)
    meta = read_metadata(files[0])
    arch = str(meta.get("general.architecture", ""))
    file_type = meta.get("general.file_type")
    return ModelFacts(
        architecture=arch,
        parameters=sum(parameter_count(path) for path in files),
        quantization="unknown" if file_type is None else FILE_TYPES.get(file_type, str(file_type)),
        context_length=int(meta.get(f"{arch}.context_length", 0)),
    )
