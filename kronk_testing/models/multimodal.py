"""Generate a tiny multimodal model for tests: a text model plus vision and audio projectors.

No vision or audio model small enough ships on PyPI, so the tests run on this one: the
tiny random-weight LLaMA of kronk_testing.models.tiny (the real Gemma 3 tokenizer) and llama.cpp
"mmproj" projectors with random weights, of types the llama-cpp-python this project pins
loads through its `mtmd` library:

- vision: `gemma3` (a SigLIP vision tower, average pooling, RMS norm and a projection;
  llama.cpp decodes its image tokens with non-causal attention, all in one batch);
- audio: `ultravox` (a Whisper encoder over 30-second chunks of 128-bin log-mel frames,
  frames stacked by 10, a SwiGLU projector; causal, so its tokens may be decoded in parts).

Their output width is the text model's embedding width. The answers are gibberish, but
images and sounds go through the real preprocessing, encoders and decoding: different
media give different logits, the same media the same.

Command line: python scripts/make_tiny_multimodal.py [--out DIR]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from kronk_testing.models.output import gguf_writer
from kronk_testing.models.tiny import N_EMBD, make_tiny_llama

TINY_MM_LLAMA = "tiny-mm-llama.gguf"
VISION_PROJECTOR = "mmproj-tiny-vision.gguf"
AUDIO_PROJECTOR = "mmproj-tiny-audio.gguf"
BOTH_PROJECTOR = "mmproj-tiny-vision-audio.gguf"

# Long enough for a conversation with a few images and 30-second sound chunks.
CONTEXT_LENGTH = 8192

# Vision tower: 224x224 images in 14-pixel patches (16x16), pooled 2x2 into 64 tokens.
IMAGE_SIZE = 224
PATCH_SIZE = 14
POOLING = 2
V_EMBD = 32
V_FF = 48
V_HEAD = 2
V_LAYER = 2

# Whisper encoder: 30 s of audio is 3000 mel frames, 1500 positions after the stride-2
# convolution, stacked by 10 into 150 tokens. The factor must divide 1500: with Ultravox's
# own 8, this llama.cpp counts 187 tokens for a chunk whose encoder makes 188, and aborts.
N_MEL = 128
A_POSITIONS = 1500
A_EMBD = 32
A_FF = 48
A_HEAD = 2
A_LAYER = 1
STACK = 10
A_HIDDEN = 64
SEED = 1

F32 = np.float32


def image_tokens() -> int:
    """Tokens of one image: the vision projector resizes every image to IMAGE_SIZE."""
    return (IMAGE_SIZE // PATCH_SIZE // POOLING) ** 2


class RandomWeights:
    def __init__(self, writer: gguf.GGUFWriter, seed: int) -> None:
        self.writer = writer
        self.rng = np.random.default_rng(seed)

    def random(self, name: str, *shape: int, scale: float = 0.05, dtype: Any = F32) -> None:
        """numpy shapes are (out, in); GGUFWriter reverses them into ggml's order."""
        data = self.rng.standard_normal(shape, dtype=F32) * scale
        self.writer.add_tensor(name, data.astype(dtype))

    def ones(self, name: str, *shape: int) -> None:
        self.writer.add_tensor(name, np.ones(shape, dtype=F32))

    def zeros(self, name: str, *shape: int) -> None:
        self.writer.add_tensor(name, np.zeros(shape, dtype=F32))

    def encoder_block(self, prefix: str, i: int, n_embd: int, n_ff: int, *, k_bias: bool) -> None:
        blk = f"{prefix}.blk.{i}"
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            self.random(f"{blk}.{part}.weight", n_embd, n_embd)
            if part != "attn_k" or k_bias:
                self.random(f"{blk}.{part}.bias", n_embd, scale=0.01)
        for norm in ("ln1", "ln2"):
            self.ones(f"{blk}.{norm}.weight", n_embd)
            self.zeros(f"{blk}.{norm}.bias", n_embd)
        self.random(f"{blk}.ffn_up.weight", n_ff, n_embd)
        self.random(f"{blk}.ffn_up.bias", n_ff, scale=0.01)
        self.random(f"{blk}.ffn_down.weight", n_embd, n_ff)
        self.random(f"{blk}.ffn_down.bias", n_embd, scale=0.01)


@dataclass(frozen=True)
class VisionTower:
    """A vision encoder's hyperparameters, as clip.cpp reads them."""

    projector_type: str
    activation: str  # "gelu" or "silu"
    image_size: int
    patch_size: int
    embedding_length: int
    feed_forward_length: int
    block_count: int
    head_count: int
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]

    def write(self, writer: gguf.GGUFWriter, n_text_embd: int) -> None:
        writer.add_bool("clip.has_vision_encoder", True)
        writer.add_string("clip.vision.projector_type", self.projector_type)
        writer.add_bool(f"clip.use_{self.activation}", True)
        writer.add_uint32("clip.vision.image_size", self.image_size)
        writer.add_uint32("clip.vision.patch_size", self.patch_size)
        writer.add_uint32("clip.vision.embedding_length", self.embedding_length)
        writer.add_uint32("clip.vision.feed_forward_length", self.feed_forward_length)
        writer.add_uint32("clip.vision.block_count", self.block_count)
        writer.add_uint32("clip.vision.projection_dim", n_text_embd)
        writer.add_uint32("clip.vision.attention.head_count", self.head_count)
        writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
        writer.add_array("clip.vision.image_mean", list(self.image_mean))
        writer.add_array("clip.vision.image_std", list(self.image_std))


GEMMA3_TOWER = VisionTower(
    "gemma3", "gelu", IMAGE_SIZE, PATCH_SIZE, V_EMBD, V_FF, V_LAYER, V_HEAD,
    (0.5, 0.5, 0.5), (0.5, 0.5, 0.5),
)  # fmt: skip


def _vision(writer: gguf.GGUFWriter, weights: RandomWeights, n_text_embd: int) -> None:
    GEMMA3_TOWER.write(writer, n_text_embd)
    writer.add_uint32("clip.vision.projector.scale_factor", POOLING)
    patches = (IMAGE_SIZE // PATCH_SIZE) ** 2
    # A strong patch embedding, so that images of different content differ clearly.
    weights.random("v.patch_embd.weight", V_EMBD, 3, PATCH_SIZE, PATCH_SIZE, scale=0.2)
    weights.random("v.patch_embd.bias", V_EMBD, scale=0.01)
    weights.random("v.position_embd.weight", patches, V_EMBD, scale=0.02)
    for i in range(V_LAYER):
        weights.encoder_block("v", i, V_EMBD, V_FF, k_bias=True)
    weights.ones("v.post_ln.weight", V_EMBD)
    weights.zeros("v.post_ln.bias", V_EMBD)
    weights.ones("mm.soft_emb_norm.weight", V_EMBD)
    weights.random("mm.input_projection.weight", V_EMBD, n_text_embd, scale=0.5)


def _audio(writer: gguf.GGUFWriter, weights: RandomWeights, n_text_embd: int) -> None:
    writer.add_bool("clip.has_audio_encoder", True)
    writer.add_string("clip.audio.projector_type", "ultravox")
    writer.add_uint32("clip.audio.embedding_length", A_EMBD)
    writer.add_uint32("clip.audio.feed_forward_length", A_FF)
    writer.add_uint32("clip.audio.block_count", A_LAYER)
    writer.add_uint32("clip.audio.projection_dim", n_text_embd)
    writer.add_uint32("clip.audio.attention.head_count", A_HEAD)
    writer.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    writer.add_uint32("clip.audio.num_mel_bins", N_MEL)
    writer.add_uint32("clip.audio.projector.stack_factor", STACK)
    # Convolutions in f16 as in converted Whisper models; their biases are (n_embd, 1).
    weights.random("a.conv1d.1.weight", A_EMBD, N_MEL, 3, scale=0.2, dtype=np.float16)
    weights.random("a.conv1d.1.bias", A_EMBD, 1, scale=0.01)
    weights.random("a.conv1d.2.weight", A_EMBD, A_EMBD, 3, scale=0.2, dtype=np.float16)
    weights.random("a.conv1d.2.bias", A_EMBD, 1, scale=0.01)
    weights.random("a.position_embd.weight", A_POSITIONS, A_EMBD, scale=0.02)
    for i in range(A_LAYER):
        weights.encoder_block("a", i, A_EMBD, A_FF, k_bias=False)
    weights.ones("a.post_ln.weight", A_EMBD)
    weights.zeros("a.post_ln.bias", A_EMBD)
    weights.ones("mm.a.norm_pre.weight", A_EMBD * STACK)
    weights.random("mm.a.mlp.1.weight", 2 * A_HIDDEN, A_EMBD * STACK, scale=0.2)
    weights.ones("mm.a.norm_mid.weight", A_HIDDEN)
    weights.random("mm.a.mlp.2.weight", n_text_embd, A_HIDDEN, scale=0.5)


def make_projector(path: Path, *, vision: bool, audio: bool, n_text_embd: int = N_EMBD) -> Path:
    """Writes an mmproj GGUF with a vision tower, an audio encoder, or both, to `path`."""
    kinds = " and ".join(k for k, on in (("vision", vision), ("audio", audio)) if on)
    name = f"Kronk tiny {kinds} projector (random weights)"
    with gguf_writer(Path(path), gguf.MODEL_ARCH.MMPROJ, name) as writer:
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)
        weights = RandomWeights(writer, SEED)
        if vision:
            _vision(writer, weights, n_text_embd)
        if audio:
            _audio(writer, weights, n_text_embd)
    return Path(path)


def make_tiny_multimodal(path: Path) -> Path:
    """The text model at `path`, with its three projectors beside it (vision, audio, both)."""
    directory = Path(path).parent
    make_projector(directory / VISION_PROJECTOR, vision=True, audio=False)
    make_projector(directory / AUDIO_PROJECTOR, vision=False, audio=True)
    make_projector(directory / BOTH_PROJECTOR, vision=True, audio=True)
    return make_tiny_llama(Path(path), context_length=CONTEXT_LENGTH)
