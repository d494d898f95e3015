"""LoRA adapters, as llama-server serves them: loaded with the model from files, listed and
scaled at /lora-adapters, chosen per request (`lora`). A request's tokens are checked against
llama.cpp applying the same adapter itself; a decode never mixes adapter sets, and no cached
prefix, slot or stored, is reused under adapters other than those it was decoded under."""

from __future__ import annotations

import asyncio
import ctypes
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import llama_cpp
import openai
import pytest

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_core.contract.errors import ConfigError, InvalidRequestError
from kronk_core.contract.types import Adapters, TokenLogprob
from kronk_core.runtime.reports import StepRecord
from kronk_llamacpp.packaged import default_model_path
from kronk_testing.models.lora import MAKERS, SMOLLM2_LORA, SMOLLM2_LORA_B, WRONG_SHAPE_LORA
from kronk_testing.models.output import cached
from kronk_testing.plugin import generated_models_dir
from kronk_testing.replay import ColdReplay, assert_same_logprobs
from kronk_testing.server import serving

pytestmark = pytest.mark.model

PROMPT = "The three primary colours are"
ANSWER = 24
SYSTEM = "You are a careful assistant who answers in one short sentence. " * 12
# A request of the model's own weights: adapter 0 at 0 (B is loaded at 0 already).
BASE = {0: 0.0}


@pytest.fixture(scope="module")
def adapters() -> dict[str, Path]:
    """The generated adapters (kronk_testing.models.lora), by file name."""
    return {name: cached(generated_models_dir() / name, make) for name, make in MAKERS.items()}


def adapted(adapters: dict[str, Path], **settings: object) -> ModelConfig:
    """SmolLM2 with adapter A (id 0, scale 1) and B (id 1, loaded at scale 0); greedy is a
    pure argmax (DRY off) and one token per decode (no speculation), as the replay decodes."""
    return ModelConfig.model_validate(
        {
            "model_path": default_model_path(),
            "context_window": 512,
            "n_seq_max": 2,
            "draft_strategy": "none",
            "sampling": {"dry_multiplier": 0.0},
            "lora": [
                str(adapters[SMOLLM2_LORA]),
                {"path": str(adapters[SMOLLM2_LORA_B]), "scale": 0.0},
            ],
            **settings,
        }
    )


@pytest.fixture(scope="module")
def kronk(tmp_path_factory: pytest.TempPathFactory, adapters: dict[str, Path]) -> Iterator[Kronk]:
    models = {
        # A KV stream per slot: a sequence rounds the same whatever the other slots hold,
        # so an answer given beside another set's is the one it gives alone.
        "adapted": adapted(
            adapters, llamacpp={"kv_unified": False}, caching={"host_cache_bytes": 0}
        ),
        # One slot and a host tier: a second conversation evicts the first to RAM.
        "one-slot": adapted(adapters, n_seq_max=1, caching={"host_cache_bytes": 1 << 30}),
        "spc": adapted(adapters, n_seq_max=1, cache="spc"),
        "never-loaded": adapted(adapters),
        "plain": ModelConfig.model_validate(
            {"model_path": default_model_path(), "context_window": 512, "n_seq_max": 1}
        ),
    }
    config = KronkConfig(base_path=tmp_path_factory.mktemp("lora"), models=models)
    with Kronk(config) as kronk:
        yield kronk


def replayed(kronk: Kronk, scales: dict[Path, float]) -> list[TokenLogprob]:
    """Greedy on a context of its own without Kronk's adapters: llama.cpp's own calls load
    and apply these adapter files at these scales; the prompt in one chunk, then a token per
    decode."""
    loaded = kronk.get_loaded("adapted")
    assert loaded is not None
    base = loaded.config.model_copy(update={"lora": []})
    replay = ColdReplay(base)
    try:
        weights, ctx = replay.model._model, replay.model._ctx
        pointers = [llama_cpp.llama_adapter_lora_init(weights, str(p).encode()) for p in scales]
        assert all(pointers)
        count = len(pointers)
        array = (llama_cpp.llama_adapter_lora_p_ctypes * count)(*pointers)
        factors = (ctypes.c_float * count)(*scales.values())
        llama_cpp.llama_set_adapters_lora(ctx, array, count, factors)
        prompt = replay.model.tokenize(PROMPT, add_special=True, parse_special=True)
        replay.prefill(prompt, 0)
        replay.generate(ANSWER)
        return replay.logprobs
    finally:
        replay.close()


async def test_an_adapter_decodes_as_llama_cpp_applies_it(
    kronk: Kronk, adapters: dict[str, Path]
) -> None:
    a, b = adapters[SMOLLM2_LORA], adapters[SMOLLM2_LORA_B]
    cases = [
        (None, {a: 1.0}),  # the model's scales: A at 1, B loaded at 0
        ({0: 0.5, 1: 0.75}, {a: 0.5, b: 0.75}),
        ({1: -1.0}, {b: -1.0}),
    ]
    for lora, scales in cases:
        result = await kronk.complete(
            PROMPT, model="adapted", max_tokens=ANSWER, temperature=0, logprobs=True, lora=lora
        )
        assert_same_logprobs(result, replayed(kronk, scales), tolerance=1e-4)
    # Scale 0 everywhere is the model's own weights, token for token.
    base = await kronk.complete(
        PROMPT, model="adapted", max_tokens=ANSWER, temperature=0, logprobs=True, lora=BASE
    )
    plain = await kronk.complete(PROMPT, model="plain", max_tokens=ANSWER, temperature=0)
    assert base.content == plain.content
    assert_same_logprobs(base, replayed(kronk, {}), tolerance=1e-4)
    # The adapter does change the answer: its log-probs part from the base's.
    adapted_answer = replayed(kronk, {a: 1.0})
    parted = max(
        abs(ours.logprob - theirs.logprob)
        for ours, theirs in zip(base.logprobs, adapted_answer, strict=False)
    )
    assert parted > 1e-2


async def test_a_decode_applies_one_adapter_set_and_each_set_gets_its_turn(
    kronk: Kronk,
) -> None:
    """Requests under different adapters run at once: no step decodes two sets, each
    answer is its own set's (as it is alone), and both make progress while the other runs."""
    alone = [
        await kronk.complete(PROMPT, model="adapted", max_tokens=ANSWER, temperature=0, lora=lora)
        for lora in (BASE, {1: 1.0})
    ]
    loaded = kronk.get_loaded("adapted")
    assert loaded is not None
    engine = loaded.engine
    steps: list[set[Adapters]] = []

    def listen(record: StepRecord) -> None:
        ids = {*record.generating, *record.prefilling}
        steps.append({engine.slots[slot].adapters for slot in ids})

    engine.add_step_listener(listen)
    try:
        together = await asyncio.gather(
            *(
                kronk.complete(PROMPT, model="adapted", max_tokens=ANSWER, temperature=0, lora=lora)
                for lora in (BASE, {1: 1.0})
            )
        )
    finally:
        engine.remove_step_listener(listen)
    assert [r.content for r in together] == [r.content for r in alone]
    assert steps and all(len(sets) == 1 for sets in steps)
    order = [next(iter(sets)) for sets in steps]
    # They take turns: the base set's steps are not all before the other's.
    first_b = order.index(((1, 1.0),))
    assert () in order[first_b:]


async def test_a_cached_prefix_is_reused_only_under_its_own_adapters(kronk: Kronk) -> None:
    conversation = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi!"}]

    async def ask(lora: dict[int, float] | None, model: str = "adapted") -> int:
        # Sampled, not greedy: an identical greedy repeat decodes its last chunk again.
        result = await kronk.chat(conversation, model=model, max_tokens=4, lora=lora)
        return result.usage.cached_tokens

    # Two slots: each adapter set's conversation stays in its own.
    assert await ask(None) == 0
    assert await ask(None) > 100
    assert await ask({1: 1.0}) == 0
    assert await ask({1: 1.0}) > 100
    assert await ask(None) > 100
    # One slot and a host tier: the other set's conversation comes back from RAM, never
    # the same prompt's state under the wrong adapters.
    assert await ask(None, "one-slot") == 0
    assert await ask({1: 1.0}, "one-slot") == 0
    one_slot = kronk.get_loaded("one-slot")
    assert one_slot is not None
    restores = one_slot.engine.cache_counters().restores
    assert await ask(None, "one-slot") > 100
    assert await ask(BASE, "one-slot") == 0
    assert await ask({1: 1.0}, "one-slot") > 100
    assert one_slot.engine.cache_counters().restores == restores + 2
    # SPC: a system prompt's state is kept per adapter set.
    assert await ask(None, "spc") == 0
    assert await ask({1: 1.0}, "spc") == 0
    assert await ask(None, "spc") > 100
    assert await ask({1: 1.0}, "spc") > 100


async def test_scales_set_for_the_model_apply_to_later_requests(kronk: Kronk) -> None:
    # A model not loaded lists its config's adapters, and stays unloaded.
    listed = await kronk.lora_adapters(model="never-loaded")
    assert [(a.id, a.scale) for a in listed] == [(0, 1.0), (1, 0.0)]
    assert kronk.get_loaded("never-loaded") is None
    listed = await kronk.lora_adapters(model="adapted")
    assert [(a.id, a.scale) for a in listed] == [(0, 1.0), (1, 0.0)]
    asked = await kronk.complete(
        PROMPT, model="adapted", max_tokens=ANSWER, temperature=0, lora={1: 0.5}
    )
    try:
        now = await kronk.set_lora_adapters({1: 0.5}, model="adapted")
        assert [(a.id, a.scale) for a in now] == [(0, 0.0), (1, 0.5)]
        default = await kronk.complete(PROMPT, model="adapted", max_tokens=ANSWER, temperature=0)
        assert default.content == asked.content
    finally:
        await kronk.set_lora_adapters({0: 1.0}, model="adapted")


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        ({2: 1.0}, "adapted has no adapter 2 (its LoRA adapters: ids 0-1)"),
        ({0: float("nan")}, "adapter 0's scale must be a finite number"),
        ({-1: 1.0}, "-1 is not an adapter id"),
    ],
)
async def test_a_request_for_adapters_the_model_lacks_is_refused(
    kronk: Kronk, lora: dict[int, float], message: str
) -> None:
    with pytest.raises(InvalidRequestError, match=re.escape(message)) as caught:
        await kronk.complete(PROMPT, model="adapted", max_tokens=2, lora=lora)
    assert caught.value.param == "lora"
    with pytest.raises(InvalidRequestError, match=r"plain has no adapter 0 \(.*: none\)"):
        await kronk.chat([{"role": "user", "content": "Hi"}], model="plain", lora={0: 1.0})


def test_an_adapter_the_model_cannot_take_is_refused_at_load(
    tmp_path: Path, adapters: dict[str, Path], minilm_path: Path
) -> None:
    cases = {
        "wrong-shape": (
            adapted(adapters, lora=[str(adapters[WRONG_SHAPE_LORA])]),
            r"models\.wrong-shape\.lora\.0\.path: llama\.cpp could not load .* incorrect shape",
        ),
        "missing": (
            adapted(adapters, lora=[str(tmp_path / "none.gguf")]),
            r"models\.missing\.lora\.0\.path: file not found",
        ),
        "embedding": (
            ModelConfig.model_validate(
                {"model_path": minilm_path, "lora": [str(adapters[SMOLLM2_LORA])]}
            ),
            r"models\.embedding\.lora: LoRA adapters apply to text models",
        ),
    }
    config = KronkConfig(base_path=tmp_path, models={k: v for k, (v, _) in cases.items()})
    with Kronk(config) as kronk:
        for model_id, (_, message) in cases.items():
            with pytest.raises(ConfigError, match=message):
                kronk.load(model_id)


def test_the_http_api_lists_sets_and_takes_adapters_as_llama_server(
    kronk: Kronk, adapters: dict[str, Path]
) -> None:
    app = create_app(ServerSettings(), kronk=kronk)
    with serving(app, lifespan="off") as base_url, httpx.Client(base_url=base_url) as http:
        where = {"model": "adapted"}
        listed = http.get("/lora-adapters", params=where)
        assert listed.status_code == 200
        assert listed.json() == [
            {"id": 0, "path": str(adapters[SMOLLM2_LORA]), "scale": 1.0},
            {"id": 1, "path": str(adapters[SMOLLM2_LORA_B]), "scale": 0.0},
        ]
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", timeout=120)
        asked = client.completions.create(
            model="adapted",
            prompt=PROMPT,
            max_tokens=ANSWER,
            temperature=0,
            extra_body={"lora": [{"id": 1, "scale": 0.5}]},
        )
        try:
            posted = http.post("/lora-adapters", params=where, json=[{"id": 1, "scale": 0.5}])
            assert posted.status_code == 200 and posted.json() == {"success": True}
            now = http.get("/lora-adapters", params=where).json()
            assert [entry["scale"] for entry in now] == [0.0, 0.5]
            default = client.completions.create(
                model="adapted", prompt=PROMPT, max_tokens=ANSWER, temperature=0
            )
            assert default.choices[0].text == asked.choices[0].text
            (entry,) = [
                e for e in http.get("/v1/kronk/slots").json()["data"] if e["model"] == "adapted"
            ]
            assert [[1, 0.5]] in [slot["adapters"] for slot in entry["slots"]]
        finally:
            http.post("/lora-adapters", params=where, json=[{"id": 0, "scale": 1}])
        bad = [
            ("/v1/chat/completions", {"lora": [{"id": 5, "scale": 1.0}]}, "no adapter 5"),
            ("/v1/completions", {"lora": [{"id": 0, "scale": "x"}]}, "lora"),
            ("/v1/completions", {"lora": [{"id": 0, "scale": 1, "x": 1}]}, "lora"),
        ]
        for path, extra, message in bad:
            body = {"model": "adapted", "max_tokens": 2, **extra}
            if path.endswith("chat/completions"):
                body["messages"] = [{"role": "user", "content": "Hi"}]
            else:
                body["prompt"] = PROMPT
            answer = http.post(path, json=body)
            assert answer.status_code == 400, answer.text
            assert message in answer.json()["error"]["message"]
        twice = [{"id": 0, "scale": 1.0}, {"id": 0, "scale": 0.5}]
        refused = http.post("/lora-adapters", params=where, json=twice)
        assert refused.status_code == 400
        assert "listed twice" in refused.json()["error"]["message"]


def test_the_memory_estimate_counts_the_adapters(kronk: Kronk, adapters: dict[str, Path]) -> None:
    found = kronk.models.memory_estimate("adapted")
    assert found is not None
    files = [Path(default_model_path()), adapters[SMOLLM2_LORA], adapters[SMOLLM2_LORA_B]]
    assert found.weights_bytes == sum(file.stat().st_size for file in files)
