"""Where the engine puts images, checked against llama.cpp's own path rather than the
replays (which share the engine's placement code): the rendered prompt, its media written
as mtmd's markers, tokenized by `mtmd_tokenize` and decoded in one go by
`mtmd_helper_eval_chunks`, then answered greedily on a plain llama.cpp context. One request
with two images and text between them; moving an image by one token moves the answer. On a
projector with one position per image token and on one with M-RoPE (Qwen2.5-VL's)."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import llama_cpp.mtmd_cpp as mtmd
import numpy as np
import pytest

from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_core.contract.media import MEDIA_MARKER, Media
from kronk_core.contract.types import ChatResult
from kronk_core.runtime.chat_stream import collect
from kronk_llamacpp.library import ensure_initialised
from kronk_testing.media_samples import striped
from kronk_testing.plugin import MultimodalPaths, QwenVlPaths

pytestmark = pytest.mark.model

N_BATCH = 2048
CONTEXT = 1024
ANSWER_TOKENS = 6
TOP = 5
# A step: the token chosen, and the log-probs of the most likely tokens by their bytes.
Step = tuple[bytes, dict[bytes, float]]
# The engine and llama.cpp's path decode the same chunks in the same batches: their
# log-probs agree to float precision. An image moved by one token changes them by about
# 1e-4 on this random-weight model (its distributions are nearly flat).
SAME = 1e-6


def distance(ours: list[Step], theirs: list[Step]) -> float:
    """The largest log-prob difference of a token both list, over the answer's steps."""
    return max(
        abs(mine[token] - other[token])
        for (_, mine), (_, other) in zip(ours, theirs, strict=True)
        for token in mine.keys() & other.keys()
    )


class MtmdReference:
    """The tiny model and its vision projector opened by llama.cpp's C API alone."""

    def __init__(self, model_path: Path, projector_path: Path) -> None:
        ensure_initialised()
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = 0
        self.model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), model_params)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = False
        params.print_timings = False
        self.mtmd = mtmd.mtmd_init_from_file(str(projector_path).encode(), self.model, params)
        assert self.mtmd

    def answer(self, text: str, images: list[bytes]) -> list[Step]:
        """The greedy answer to `text` (its images where MEDIA_MARKER stands): each
        token's bytes and the TOP most likely tokens' bytes and log-probs."""
        context_params = llama_cpp.llama_context_default_params()
        context_params.n_ctx = CONTEXT
        context_params.n_batch = context_params.n_ubatch = N_BATCH
        context = llama_cpp.llama_init_from_model(self.model, context_params)
        keep: list[Any] = []
        bitmaps = []
        for data in images:
            buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
            keep.append(buffer)
            bitmaps.append(
                mtmd.mtmd_helper_bitmap_init_from_buf(self.mtmd, buffer, len(data), False)
            )
        array = (mtmd.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
        data = text.replace(MEDIA_MARKER, mtmd.mtmd_default_marker().decode()).encode()
        prompt = mtmd.mtmd_input_text(data, len(data), False, True)
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            assert (
                mtmd.mtmd_tokenize(self.mtmd, chunks, ctypes.byref(prompt), array, len(bitmaps))
                == 0
            )
            past = llama_cpp.llama_pos(0)
            status = mtmd.mtmd_helper_eval_chunks(
                self.mtmd, context, chunks, 0, 0, N_BATCH, True, ctypes.byref(past)
            )
            assert status == 0
            return self._greedy(context)
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)
            llama_cpp.llama_free(context)

    def _greedy(self, context: Any) -> list[Step]:
        answer = []
        for _ in range(ANSWER_TOKENS):
            row = llama_cpp.llama_get_logits_ith(context, -1)
            logits = np.ctypeslib.as_array(row, shape=(self.n_vocab,)).astype(np.float64)
            top = logits.max()
            logprobs = logits - top - np.log(np.exp(logits - top).sum())
            token = int(logprobs.argmax())
            if llama_cpp.llama_vocab_is_eog(self.vocab, token):
                break
            best = np.argsort(-logprobs)[:TOP]
            answer.append(
                (self._piece(token), {self._piece(int(t)): float(logprobs[t]) for t in best})
            )
            batch = llama_cpp.llama_batch_get_one((llama_cpp.llama_token * 1)(token), 1)
            assert llama_cpp.llama_decode(context, batch) == 0
        return answer

    def _piece(self, token: int) -> bytes:
        buffer = ctypes.create_string_buffer(64)
        size = llama_cpp.llama_token_to_piece(self.vocab, token, buffer, len(buffer), 0, True)
        return buffer.raw[:size]

    def close(self) -> None:
        mtmd.mtmd_free(self.mtmd)
        llama_cpp.llama_model_free(self.model)


@pytest.fixture(scope="module", params=["gemma3", "qwen2.5vl"])
def vision(request: pytest.FixtureRequest) -> tuple[Path, Path]:
    """A tiny model and its vision projector: llama.cpp's `gemma3` type (one position per
    image token, decoded whole) or `qwen2.5vl_merger` (M-RoPE: an image's tokens take
    max(rows, columns) positions, so the text after it runs behind its token indices)."""
    if request.param == "gemma3":
        paths: MultimodalPaths = request.getfixturevalue("multimodal_paths")
        return paths.model, paths.vision
    qwen: QwenVlPaths = request.getfixturevalue("qwen_vl_paths")
    return qwen.model, qwen.vision


@pytest.fixture(scope="module")
def reference(vision: tuple[Path, Path]) -> Iterator[MtmdReference]:
    opened = MtmdReference(*vision)
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def kronk(vision: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kronk]:
    settings = {
        "model_path": vision[0],
        "projector_path": vision[1],
        "templates": {"template": "gemma"},
        "context_window": CONTEXT,
        "n_seq_max": 1,
        "draft_strategy": "none",
        "cache": "none",
    }
    # The same with prompt lookup on, always drafting (not adaptive).
    lookup = {**settings, "draft_strategy": "lookup", "speculative": {"adaptive": False}}
    config = KronkConfig(
        base_path=tmp_path_factory.mktemp("media-reference"),
        models={
            "vision": ModelConfig.model_validate(settings),
            "vision-lookup": ModelConfig.model_validate(lookup),
        },
    )
    with Kronk(config) as instance:
        yield instance


FIRST, SECOND = striped((96, 64), 0), striped((96, 64), 3)
CONTENT = [
    "Compare the first picture",
    Media.from_bytes(FIRST),
    "with the second one, and say which has more stripes:",
    Media.from_bytes(SECOND),
    "Answer:",
]


async def answered(kronk: Kronk, model: str, content: list[Any]) -> tuple[ChatResult, str]:
    """The greedy answer with its log-probs, and the rendered prompt."""
    request = kronk.chat_request(
        [{"role": "user", "content": content}],
        model=model,
        temperature=0,
        max_tokens=ANSWER_TOKENS,
        logprobs=True,
        top_logprobs=TOP,
    )
    stream = await kronk.start_chat(request)
    return await collect(stream), stream.prompt_text


def steps(result: ChatResult) -> list[Step]:
    return [
        (bytes(item.bytes), {bytes(top.bytes): top.logprob for top in item.top_logprobs})
        for item in result.logprobs
    ]


async def test_two_images_with_text_between_answer_as_llama_cpp_s_own_path(
    kronk: Kronk, reference: MtmdReference
) -> None:
    result, text = await answered(kronk, "vision", CONTENT)
    assert text.count(MEDIA_MARKER) == 2
    ours = steps(result)
    theirs = reference.answer(text, [FIRST, SECOND])
    assert [piece for piece, _ in ours] == [piece for piece, _ in theirs]
    pairs = zip(ours, theirs, strict=True)
    assert all(len(mine.keys() & other.keys()) == TOP for (_, mine), (_, other) in pairs)
    assert distance(ours, theirs) < SAME, (ours, theirs)

    # The same prompt with the second image one token later ("Answer" is one token): its
    # log-probs are a hundred times further off, so an image placed one token off fails.
    assert len(await kronk.tokenize("Answer", model="vision")) == 1
    moved = text.replace(f"{MEDIA_MARKER}Answer:", f"Answer{MEDIA_MARKER}:", 1)
    assert moved != text
    shifted = reference.answer(moved, [FIRST, SECOND])
    assert distance(shifted, theirs) > 100 * SAME, (shifted, theirs)


async def test_requests_with_images_decode_without_drafts_where_speculation_is_on(
    kronk: Kronk, reference: MtmdReference
) -> None:
    """A draft strategy reads tokens, not media positions: a request with images is not
    speculated on and answers exactly as llama.cpp's path does; a text request to the
    same model is."""
    result, text = await answered(kronk, "vision-lookup", CONTENT)
    assert result.usage.accepted_prediction_tokens == result.usage.rejected_prediction_tokens == 0
    assert distance(steps(result), reference.answer(text, [FIRST, SECOND])) < SAME
    repeated = "one two three four five six seven eight nine ten " * 12
    plain, _ = await answered(kronk, "vision-lookup", [repeated + "one two"])
    assert plain.usage.accepted_prediction_tokens + plain.usage.rejected_prediction_tokens > 0
