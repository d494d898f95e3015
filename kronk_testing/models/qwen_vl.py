"""Generate a tiny Qwen2.5-VL-shaped model for tests: the text model and its vision projector.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL place an image's tokens with M-RoPE: each image token
has a temporal, a row and a column position (the rope's sections), all tokens of one image
share the temporal one, and the text after the image goes on from the image's first
position plus max(rows, columns), not plus its token count. This model has the real
architectures (llama.cpp's `qwen2vl` text model, the `qwen2.5vl_merger` projector with its
two-frame patch embedding, RMS norms, SiLU-gated MLPs, window attention on every other
layer and the 2x2 patch merger), at sizes that load and run in milliseconds, random
weights and Gemma 3's tokenizer (kronk_testing.models.tiny).

Images are resized to multiples of 28 pixels (14-pixel patches, merged 2x2): a 224 x 112
image is 8 x 4 tokens, 32 tokens taking 8 positions.

Command line: python scripts/make_tiny_qwen_vl.py [--out DIR]
"""

from __future__ import annotations

from pathlib import Path

import gguf

from kronk_testing.models.multimodal import RandomWeights, VisionTower
from kronk_testing.models.output import gguf_writer
from kronk_testing.models.tiny import N_EMBD, N_HEAD, fill_text_model, gemma_gguf_path

TINY_QWEN_VL = "tiny-qwen-vl.gguf"
QWEN_VL_PROJECTOR = "mmproj-tiny-qwen-vl.gguf"

CONTEXT_LENGTH = 8192
# The text model's rope sections (temporal, rows, columns, unused) over its head's
# rotated half: Qwen2.5-VL's own are 16, 24, 24 of 64.
ROPE_SECTIONS = [2, 3, 3, 0]

PATCH_SIZE = 14
MERGE = 2
V_EMBD = 32
V_FF = 48
V_HEAD = 2
V_LAYER = 2
WINDOW_PATTERN = 2  # every second layer attends over the whole image, the others in windows
WINDOW_SIZE = 112  # pixels: 4 x 4 merged tokens
SEED = 2
QWEN25_VL_TOWER = VisionTower(
    "qwen2.5vl_merger", "silu", 224, PATCH_SIZE, V_EMBD, V_FF, V_LAYER, V_HEAD,
    (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711),
)  # fmt: skip


def make_projector(path: Path, n_text_embd: int = N_EMBD) -> Path:
    name = "Kronk tiny Qwen2.5-VL vision projector (random weights)"
    with gguf_writer(Path(path), gguf.MODEL_ARCH.MMPROJ, name) as writer:
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)
        weights = RandomWeights(writer, SEED)
        QWEN25_VL_TOWER.write(writer, n_text_embd)
        writer.add_uint32("clip.vision.spatial_merge_size", MERGE)
        writer.add_uint32("clip.vision.n_wa_pattern", WINDOW_PATTERN)
        writer.add_uint32("clip.vision.window_size", WINDOW_SIZE)
        # Two frames' patch embeddings (a still image goes through both), no bias.
        for suffix in ("", ".1"):
            weights.random(f"v.patch_embd.weight{suffix}", V_EMBD, 3, PATCH_SIZE, PATCH_SIZE,
                           scale=0.2)  # fmt: skip
        for i in range(V_LAYER):
            blk = f"v.blk.{i}"
            for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
                weights.random(f"{blk}.{part}.weight", V_EMBD, V_EMBD)
                weights.random(f"{blk}.{part}.bias", V_EMBD, scale=0.01)
            weights.ones(f"{blk}.ln1.weight", V_EMBD)
            weights.ones(f"{blk}.ln2.weight", V_EMBD)
            for part, rows, cols in (("ffn_gate", V_FF, V_EMBD), ("ffn_up", V_FF, V_EMBD),
                                     ("ffn_down", V_EMBD, V_FF)):  # fmt: skip
                weights.random(f"{blk}.{part}.weight", rows, cols)
                weights.random(f"{blk}.{part}.bias", rows, scale=0.01)
        weights.ones("v.post_ln.weight", V_EMBD)
        # The merger: 2 x 2 patches' features, an MLP to the text model's width.
        merged = V_EMBD * MERGE * MERGE
        weights.random("mm.0.weight", merged, merged, scale=0.1)
        weights.random("mm.0.bias", merged, scale=0.01)
        weights.random("mm.2.weight", n_text_embd, merged, scale=0.5)
        weights.random("mm.2.bias", n_text_embd, scale=0.01)
    return Path(path)


def make_tiny_qwen_vl(path: Path) -> Path:
    """The `qwen2vl` text model at `path`, its projector (QWEN_VL_PROJECTOR) beside it."""
    make_projector(Path(path).parent / QWEN_VL_PROJECTOR)
    name = "Kronk tiny Qwen2.5-VL (random weights, Gemma 3 tokenizer)"
    with gguf_writer(Path(path), gguf.MODEL_ARCH.QWEN2VL, name) as writer:
        fill_text_model(writer, CONTEXT_LENGTH, gemma_gguf_path(), qkv_bias=True)
        writer.add_rope_dimension_sections(ROPE_SECTIONS)
    assert sum(ROPE_SECTIONS) * 2 * N_HEAD == N_EMBD
    return Path(path)
