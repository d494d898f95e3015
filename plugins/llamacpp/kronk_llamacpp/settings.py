"""The llamacpp plugin's section of each model's entry (`models.<id>.llamacpp`)."""

from __future__ import annotations

import os
from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kronk_core.contract import ModelSection
from kronk_llamacpp.endpoint import Endpoint


class CacheType(StrEnum):
    """KV cache element types llama.cpp accepts for cache_type_k / cache_type_v."""

    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    q8_0 = "q8_0"
    q4_0 = "q4_0"
    q4_1 = "q4_1"
    iq4_nl = "iq4_nl"
    q5_0 = "q5_0"
    q5_1 = "q5_1"


class FlashAttention(StrEnum):
    enabled = "enabled"
    disabled = "disabled"
    auto = "auto"


class SplitMode(StrEnum):
    none = "none"
    layer = "layer"
    row = "row"


class RopeScaling(StrEnum):
    none = "none"
    linear = "linear"
    yarn = "yarn"


class StructuredOutputLimits(BaseModel):
    """How large a constraint on a request's output may be: a JSON schema (`response_format`,
    `json_schema`, a Responses `text.format`), a GBNF `grammar`, or the tools of a forced
    call. Each bounds the memory or time compiling takes, or what the grammar costs per
    token: every sampled token is checked against each branch the grammar has open."""

    model_config = ConfigDict(extra="forbid")

    max_schema_bytes: PositiveInt = 256 * 1024
    max_schema_depth: PositiveInt = 32
    max_enum_values: PositiveInt = 1000
    # minItems, maxItems, minLength, maxLength, minProperties, maxProperties, a pattern's {m,n}.
    max_repetition: PositiveInt = 1000
    max_properties: PositiveInt = 1000
    # anyOf/oneOf/allOf branches, types in a type list, tools a forced call chooses from.
    max_alternatives: PositiveInt = 128
    max_grammar_bytes: PositiveInt = 512 * 1024
    # llama.cpp recurses per level of parentheses: past about 20,000 its thread's stack ends.
    max_grammar_depth: Annotated[int, Field(gt=0, le=8192)] = 2048
    max_grammar_branches: PositiveInt = 256
    compile_seconds: Annotated[float, Field(gt=0.0)] = 5.0
    # Compiled grammars kept per model, by their schema or grammar text.
    cache_entries: Annotated[int, Field(ge=0)] = 32


class LlamaCppSettings(BaseModel):
    """How llama.cpp loads one model and builds its context."""

    model_config = ConfigDict(extra="forbid")

    n_ubatch: Annotated[int, Field(gt=0)] = 512
    n_threads: Annotated[int, Field(ge=0)] = 0
    cache_type_k: CacheType = CacheType.f16
    cache_type_v: CacheType = CacheType.f16
    flash_attention: FlashAttention = FlashAttention.auto
    # The Kronk manual's convention: 0 (or "all") = every layer, -1 (or "none") = CPU only.
    n_gpu_layers: Annotated[int, Field(ge=-1)] = 0
    # llama.cpp's convention (its -ngl, llama-cpp-python's n_gpu_layers): -1 (or "auto",
    # "all") = every layer, 0 (or "none") = CPU only; folded into n_gpu_layers.
    gpu_layers: Annotated[int, Field(ge=-1)] | None = None
    offload_kqv: bool = True
    op_offload: bool = True
    split_mode: SplitMode = SplitMode.layer
    main_gpu: Annotated[int, Field(ge=0)] = 0
    # Pin the model to one device by its name (`kronk devices`: CUDA0, Vulkan1, Metal, CPU).
    device: Annotated[str, Field(min_length=1)] | None = None
    # llama.cpp RPC workers (`kronk rpc start`) the model's layers are spread over, as
    # HOST:PORT; their devices come first, then this machine's GPUs (llama-server's --rpc).
    rpc_servers: list[str] | None = None
    # Share of the model each GPU gets, in the order `kronk devices` lists them.
    tensor_split: Annotated[list[Annotated[float, Field(ge=0.0)]], Field(min_length=1)] | None = (
        None
    )
    # Sliding-window layers keep only their window (as llama-server does): full-size SWA
    # caches make every token attend over the whole context. IMC checkpoints instead.
    swa_full: bool = False
    # One KV pool shared by all slots, or a stream per slot; `auto` (params.unified_kv) takes
    # a stream per slot for models whose every layer attends over the whole context, where
    # a pool would make each slot attend over all slots' cells (docs/configuration.md).
    kv_unified: bool | Literal["auto"] = "auto"
    # Hand out a step's text while the device decodes the next step (a GPU's decode returns
    # before it finishes). Off: on an H100 it cost 8% at one stream (docs/gpu.md).
    overlap_decode: bool = False
    # Greedy requests without log-probs take their argmax on the device, so only token ids
    # come back. Off: on an H100 the device time grew by what the host saved (docs/gpu.md).
    device_sampling: bool = False
    rope_scaling: RopeScaling = RopeScaling.none
    rope_freq_base: Annotated[float, Field(gt=0.0)] | None = None
    rope_freq_scale: Annotated[float, Field(gt=0.0)] | None = None
    yarn_ext_factor: float | None = None
    yarn_attn_factor: Annotated[float, Field(gt=0.0)] | None = None
    yarn_beta_fast: float | None = None
    yarn_beta_slow: float | None = None
    yarn_orig_ctx: Annotated[int, Field(ge=0)] | None = None
    structured_output: StructuredOutputLimits = Field(default_factory=StructuredOutputLimits)

    @field_validator("cache_type_k", "cache_type_v", mode="before")
    @classmethod
    def _lower_cache_type(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("n_gpu_layers", mode="before")
    @classmethod
    def _kronk_layer_words(cls, value: Any) -> Any:
        words = {"all": 0, "none": -1}
        return words.get(value.lower(), value) if isinstance(value, str) else value

    @field_validator("gpu_layers", mode="before")
    @classmethod
    def _llama_cpp_layer_words(cls, value: Any) -> Any:
        return _llama_cpp_layers(value)

    @model_validator(mode="after")
    def _one_layer_count(self) -> Self:
        """gpu_layers, or GGML_N_GPU_LAYERS above every setting (the manual's order), in
        llama.cpp's convention, becomes n_gpu_layers in Kronk's."""
        environment = os.environ.get(GGML_N_GPU_LAYERS, "").strip()
        if environment:
            try:
                layers: int | None = int(_llama_cpp_layers(environment))
            except ValueError:
                raise ValueError(
                    f"{GGML_N_GPU_LAYERS}={environment!r} is not a layer count (a number, "
                    "-1 or auto for all, 0 or none for none)"
                ) from None
        else:
            layers = self.gpu_layers
            if layers is not None and "n_gpu_layers" in self.model_fields_set:
                raise ValueError(
                    "gpu_layers (llama.cpp's convention) and n_gpu_layers (Kronk's) both set: "
                    "set one"
                )
        if layers is None:
            return self
        if layers < -1:
            raise ValueError(f"{GGML_N_GPU_LAYERS} must be -1 or more, got {layers}")
        self.n_gpu_layers = {-1: 0, 0: -1}.get(layers, layers)
        self.gpu_layers = None
        self.model_fields_set.discard("gpu_layers")
        return self

    @field_validator("device", mode="before")
    @classmethod
    def _no_device(cls, value: Any) -> Any:
        return None if value == "" else value  # the manual writes "" for "none pinned"

    @field_validator("rpc_servers", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        # llama-server's spelling: one string, comma-separated.
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        return value or None

    @field_validator("rpc_servers")
    @classmethod
    def _distinct_servers(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if value is None:
            return value
        value = [str(Endpoint.parse(server)) for server in value]
        if len(set(value)) != len(value):
            raise ValueError("names a server twice")
        if info.data.get("device") is not None:
            raise ValueError("device pins the model to one device; set device or rpc_servers")
        return value

    @field_validator("n_ubatch")
    @classmethod
    def _ubatch_within_batch(cls, value: int, info: ValidationInfo) -> int:
        # n_batch is the model's core key: the section is validated in its context.
        owner = (info.context or {}).get("owner")
        n_batch = getattr(owner, "n_batch", None)
        if n_batch is not None and value > n_batch:
            raise ValueError(f"must be less than or equal to n_batch ({n_batch}), got {value}")
        return value

    @field_validator("tensor_split")
    @classmethod
    def _one_placement(cls, value: list[float] | None, info: ValidationInfo) -> list[float] | None:
        if value is None:
            return value
        if not any(value):
            raise ValueError("needs at least one share above 0")
        if info.data.get("device") is not None:
            raise ValueError("device pins the model to one device; set device or tensor_split")
        return value


# llama.cpp's layer count for every model, above any setting (the Kronk manual's backend notes).
GGML_N_GPU_LAYERS = "GGML_N_GPU_LAYERS"


def _llama_cpp_layers(value: Any) -> Any:
    words = {"auto": -1, "all": -1, "none": 0}
    return words.get(value.strip().lower(), value) if isinstance(value, str) else value


# The Kronk manual writes these at the top of a model's entry: `n_ubatch: 512`, `nubatch: 512`.
_FLAT = (
    "n_ubatch",
    "n_threads",
    "cache_type_k",
    "cache_type_v",
    "flash_attention",
    "n_gpu_layers",
    "gpu_layers",
    "offload_kqv",
    "op_offload",
    "split_mode",
    "main_gpu",
    "device",
    "rpc_servers",
    "tensor_split",
    "swa_full",
    "rope_scaling",
    "rope_freq_base",
    "rope_freq_scale",
    "yarn_ext_factor",
    "yarn_attn_factor",
    "yarn_beta_fast",
    "yarn_beta_slow",
    "yarn_orig_ctx",
)
_MANUAL = {
    "nubatch": "n_ubatch",
    "nthreads": "n_threads",
    "cache-type-k": "cache_type_k",
    "cache-type-v": "cache_type_v",
    "flash-attention": "flash_attention",
    "ngpu-layers": "n_gpu_layers",
    "split-mode": "split_mode",
    "main-gpu": "main_gpu",
    "tensor-split": "tensor_split",
    "rpc": "rpc_servers",  # llama-server's --rpc
    "swa-full": "swa_full",
    "offload-kqv": "offload_kqv",
    "op-offload": "op_offload",
    "rope-scaling-type": "rope_scaling",
    "rope-freq-base": "rope_freq_base",
    "rope-freq-scale": "rope_freq_scale",
    "yarn-ext-factor": "yarn_ext_factor",
    "yarn-attn-factor": "yarn_attn_factor",
    "yarn-beta-fast": "yarn_beta_fast",
    "yarn-beta-slow": "yarn_beta_slow",
    "yarn-orig-ctx": "yarn_orig_ctx",
}
# The manual's keys for llama.cpp features this plugin leaves at llama.cpp's defaults.
_IGNORED = {
    "use-direct-io": "llama.cpp's default file reading is used",
    "nthreads-batch": "llamacpp.n_threads sets both thread counts",
    "use-mmap": "llama.cpp maps model files as it does by default",
    "numa": "NUMA placement is left to the operating system",
    "devices": "pin one device with llamacpp.device, or share among GPUs with "
    "llamacpp.tensor_split",
    "moe": "experts are placed as llama.cpp places them",
    "tensor-buft-overrides": "tensors are placed as llama.cpp places them",
    "op-offload-min-batch": "llamacpp.op_offload switches offloading on or off",
}

SETTINGS = ModelSection(
    "llamacpp",
    LlamaCppSettings,
    spellings={**{key: key for key in _FLAT}, **_MANUAL},
    ignored=_IGNORED,
)
