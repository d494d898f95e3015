"""Speculative decoding on real models: the target's output, whatever the draft.

The target is Gemma 3 270M; its draft model is the same model requantized to
Q4_0, so it agrees with the target often but not always; prompt lookup drafts
from the prompt; a draft strategy of the target's own second choices drafts
near misses on SmolLM2-135M-Instruct, whose prose hesitates often. Every
greedy answer is checked against a replay (kronk_testing.replay) that decodes the
batches the speculating engine decoded (the draft tokens included, at the same
positions and slots), picks greedily from its own logits, keeps a draft token
only where it picked that token, and cuts the rest from the KV: every token and
log-prob must be the replay's, to the end of the answer. (A run without
speculation decodes other batches, and llama.cpp's batch-shape rounding can
flip a near-tie between the two; docs/caching.md, "Numerics".) Most models here
draft every step they can (`adaptive: false`); `lookup-adaptive` drafts as the
policy decides.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, LoadedModel, ModelConfig, hookimpl
from kronk_core.contract.backend import Batch
from kronk_core.contract.cache import PromptScope
from kronk_core.contract.drafts import Draft, DraftRequest, DraftStrategy
from kronk_core.contract.errors import ConfigError, KronkError, ModelLoadError
from kronk_core.contract.registry import Register
from kronk_core.contract.sampling import Distribution, SamplerStage, TopK
from kronk_core.contract.tokens import common_prefix
from kronk_core.contract.types import ChatResult, SamplingParams
from kronk_core.prompts import prepare_chat
from kronk_core.runtime.reports import StepRecord
from kronk_llamacpp.model import LlamaTextModel
from kronk_llamacpp.packaged import default_model_path
from kronk_sampling.plugin import default_stages
from kronk_speculative.draft_model import draft_stages
from kronk_testing.replay import BatchReplay, Start, prompt_of
from kronk_testing.waiting import gated, wait_until

BASE: dict[str, Any] = {
    "templates": {"template": "gemma"},
    "context_window": 4096,
    "n_seq_max": 4,
    # DRY off: it would keep the model from repeating the file it is asked to repeat.
    "sampling": {"dry_multiplier": 0.0},
}
NO_HOST_TIER = {"caching": {"host_cache_bytes": 0}}
# The draft model costs as much as the target, so drafting it never pays on a CPU and the
# adaptive policy would hardly use it: these tests make it draft every step.
DRAFT = {
    "draft_strategy": "draft",
    "speculative": {"model-id": "gemma-draft", "ndraft": 5, "adaptive": False},
}
LOOKUP = {"draft_strategy": "lookup", "speculative": {"adaptive": False}}
STORY = "Tell me a long story about dragons."


def python_file(name: str, functions: int) -> str:
    lines: list[str] = []
    # Numbered from 1: `def f_0` followed by `value * 1` is a near-tie for the model.
    for index in range(1, functions + 1):
        lines += [
            f"def {name}_{index}(values):",
            "    total = 0",
            "    for value in values:",
            f"        total += value * {index}",
            "    return total",
            "",
        ]
    return "\n".join(lines)


def edit(name: str, functions: int = 10) -> str:
    return (
        f"Here is a Python file:\n\n```python\n{python_file(name, functions)}\n```\n\n"
        "Repeat the whole file exactly, but rename `values` to `items` everywhere. "
        "Output only the code."
    )


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def models(
    gemma_path: str, gemma_draft_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Kronk]:
    def entry(**settings: Any) -> ModelConfig:
        return ModelConfig.model_validate({"model_path": gemma_path, **BASE, **settings})

    config = KronkConfig(
        base_path=tmp_path_factory.mktemp("kronk-speculative"),
        models_in_cache=8,
        models={
            "plain": entry(cache="none", draft_strategy="none"),
            "lookup": entry(cache="none", **LOOKUP),
            "lookup-adaptive": entry(cache="none", draft_strategy="lookup"),
            "lookup-imc": entry(**LOOKUP, **NO_HOST_TIER),
            "draft": entry(cache="none", **DRAFT),
            "draft-imc": entry(**DRAFT, **NO_HOST_TIER),
            "repeat-last": entry(cache="none", draft_strategy="repeat-last"),
            "gemma-draft": ModelConfig(model_path=gemma_draft_path),
        },
    )
    kronk = Kronk(config, plugins={"repeat": RepeatLastPlugin()})
    yield kronk
    kronk.close()


Messages = list[dict[str, str]]
ASKED: dict[str, Any] = {"max_tokens": 200, "temperature": 0, "logprobs": True, "top_logprobs": 5}


async def ask(kronk: Kronk, model: str, messages: Messages, **params: Any) -> ChatResult:
    return await kronk.chat(messages, model=model, **ASKED | params)


class Replayed:
    """A model loaded afresh, and a replay of every batch its engine decodes from then on.

    Fresh, so that the replay's KV starts as the engine's did: which cells a batch's tokens
    take, and so how they round, follows from every decode and cut since the load.
    """

    def __init__(self, kronk: Kronk, model: str) -> None:
        kronk.unload(model)
        loaded = kronk.load(model)
        assert isinstance(loaded, LoadedModel)
        self.kronk, self.model, self.loaded = kronk, model, loaded
        self.replay = BatchReplay(loaded.config)
        self.steps: list[StepRecord] = []  # those of the last ask()
        # Each sequence a slot held after prefilling: without a cache a slot is empty again
        # once its request ends, so this says which slot a prompt was given.
        self._slots: dict[tuple[int, ...], int] = {}
        loaded.engine.add_step_listener(self._listen)

    def _listen(self, record: StepRecord) -> None:  # on the engine thread
        self.steps.append(record)
        for slot in record.prefilling:
            self._slots[tuple(self.loaded.engine.slots[slot].tokens)] = slot

    def slot_of(self, prompt: Sequence[int]) -> int:
        """The slot the last ask() prefilled this prompt in."""
        return self._slots[tuple(prompt)]

    async def ask(self, conversations: Sequence[Messages], **params: Any) -> list[ChatResult]:
        """Answers to the conversations, asked at once, each the replay's token for token."""
        self.steps.clear()  # the last ask's were all in when it was checked
        engine = self.loaded.engine
        before = engine.stats().steps
        # The first is held after its first step until the rest are queued: however slow the
        # machine, their slots then fill together and carry their drafts in the same decodes.
        with gated(engine, lambda record: record.index > before) as gate:
            first = asyncio.ensure_future(ask(self.kronk, self.model, conversations[0], **params))
            await gate.wait_held()
            rest = [
                asyncio.ensure_future(ask(self.kronk, self.model, messages, **params))
                for messages in conversations[1:]
            ]
            await wait_until(lambda: engine.stats().queued == len(rest), timeout=60)
        results = list(await asyncio.gather(first, *rest))
        requests: dict[int, Start] = {}
        for messages, result in zip(conversations, results, strict=True):
            request = self.kronk.chat_request(messages, model=self.model, **ASKED | params)
            scope = PromptScope(remember=False)
            generation = prepare_chat(self.loaded, request, scope).generation
            stages = self.loaded.engine.sampler_stages(generation.sampling)
            prompt = generation.prompt_tokens
            requests[self._slots[tuple(prompt)]] = Start(prompt, result, stages=stages)
        await self.replay.check(self.steps, requests)
        return results

    def close(self) -> None:
        self.loaded.engine.remove_step_listener(self._listen)
        self.replay.close()


def drafting_slots(record: StepRecord) -> int:
    return sum(count > 1 for count in record.generating.values())


@pytest.mark.parametrize("model", ["lookup", "lookup-adaptive", "lookup-imc", "draft", "draft-imc"])
async def test_greedy_output_is_the_targets_token_for_token(models: Kronk, model: str) -> None:
    # Answers of 120 tokens: the files are still being repeated where they stop.
    answer = 120
    conversations = [
        user(edit("alpha", 6)), user(edit("beta", 6)), user(STORY), user(edit("gamma", 6))
    ]  # fmt: skip
    replayed = Replayed(models, model)
    try:
        speculated = await replayed.ask(conversations, max_tokens=answer)
    finally:
        replayed.close()
    assert all(result.usage.completion_tokens == answer for result in speculated)
    accepted = sum(result.usage.accepted_prediction_tokens for result in speculated)
    assert accepted > answer
    assert sum(result.usage.rejected_prediction_tokens for result in speculated) > 0
    # Several slots carried their drafts in one decode.
    assert max(drafting_slots(record) for record in replayed.steps) >= 2
    # Fewer decodes than tokens: drafts stood.
    assert len(replayed.steps) < answer


@pytest.mark.parametrize("model", ["lookup-imc", "draft-imc"])
async def test_a_cached_conversation_speculates_exactly(models: Kronk, model: str) -> None:
    """Turn after turn on IMC: the cached prefix is reused, by the draft model too."""
    messages = user(edit("delta", 6))
    replayed = Replayed(models, model)
    strategy = replayed.loaded.engine.draft_strategy
    try:
        for turn, rename in enumerate(["items", "numbers", "entries"]):
            decoded_before = getattr(strategy, "prefilled_tokens", 0)
            (cached,) = await replayed.ask([messages], max_tokens=120)
            assert cached.usage.accepted_prediction_tokens > 0
            prompt = cached.usage.prompt_tokens
            if turn:
                assert cached.usage.cached_tokens > prompt // 2
            if model == "draft-imc":
                # Context the draft model decoded: the prompt on the first turn; later only
                # the new turn (and, each step, the target's tokens it had not drafted itself).
                decoded = getattr(strategy, "prefilled_tokens", 0) - decoded_before
                assert decoded > prompt if turn == 0 else decoded < prompt // 2
            messages += [
                {"role": "assistant", "content": cached.content},
                {"role": "user", "content": f"Now rename them to `{rename}` instead."},
            ]
    finally:
        replayed.close()


async def test_stateful_samplers_follow_the_accepted_drafts(models: Kronk) -> None:
    """DRY and repetition penalties see every accepted draft token, as without speculation:
    the replay's chain, which carries the same penalties, picks the same tokens."""
    penalties = {"dry_multiplier": 0.8, "repeat_penalty": 1.1, "max_tokens": 150}
    for model in ("lookup", "draft"):
        replayed = Replayed(models, model)
        try:
            (speculated,) = await replayed.ask([user(edit("epsilon", 6))], **penalties)
        finally:
            replayed.close()
        assert speculated.usage.accepted_prediction_tokens > 0


async def test_grammar_constrained_requests_speculate_under_the_grammar(models: Kronk) -> None:
    record = {"name": "Kestrel", "crew": 12, "ports": ["Bergen", "Tromso", "Reykjavik"]}
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "crew": {"type": "integer"},
            "ports": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["name", "crew", "ports"],
    }
    conversation = user(f"Repeat this JSON exactly: {json.dumps(record)}")
    for model in ("lookup", "draft"):
        replayed = Replayed(models, model)
        try:
            (speculated,) = await replayed.ask(
                [conversation], json_schema=json.dumps(schema), max_tokens=80
            )
        finally:
            replayed.close()
        assert speculated.usage.accepted_prediction_tokens > 0
        assert set(json.loads(speculated.content)) == {"name", "crew", "ports"}


class NearMisses:
    """Drafts the target's own second choice wherever the target hesitates (its first two
    within MARGIN nats), else its first: the drafts a lossy acceptance rule would keep. It
    reads the target on a context of its own, one sequence per slot, one token a step."""

    name = "near-misses"
    ndraft = 1
    adaptive = False
    reproducible = False
    MARGIN = 1.0

    def __init__(self, config: ModelConfig) -> None:
        self.model = LlamaTextModel(config.model_copy(update={"id": "near-misses"}))
        self.held: dict[int, list[int]] = {}
        self.second_choices = 0

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        return [Draft((self._guess(r.slot_id, r.context),)) for r in requests]

    def _guess(self, slot: int, context: Sequence[int]) -> int:
        held = self.held.setdefault(slot, [])
        keep = min(common_prefix(held, context), len(context) - 1)
        if not self.model.seq_remove(slot, keep, -1):
            keep = 0
            self.model.seq_remove(slot, 0, -1)
        del held[keep:]
        batch = Batch()
        for position in range(keep, len(context)):
            batch.add(context[position], position, slot, position == len(context) - 1)
        self.model.decode(batch)
        held.extend(context[keep:])
        sampler = self.model.new_sampler([TopK(2), Distribution(0)])
        try:
            found = sampler.distribution(len(batch) - 1, 2)
        finally:
            sampler.close()
        assert found is not None and len(found.tokens) == 2
        (first, p_first), (second, p_second) = sorted(
            zip(found.tokens, found.probs, strict=True), key=lambda pair: -pair[1]
        )
        if math.log(p_first / p_second) < self.MARGIN:
            self.second_choices += 1
            return second
        return first

    def close(self) -> None:
        self.model.close()


class NearMissesPlugin:
    @hookimpl
    def kronk_register_draft_strategies(self, register: Register[Any]) -> None:
        def factory(*, model_config: ModelConfig, **_: Any) -> DraftStrategy:
            return NearMisses(model_config)

        register("near-misses", factory)


@pytest.fixture(scope="module")
def hesitant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kronk]:
    """The default model drafting its own second choices. Its prose hesitates often (in an
    answer of 200 tokens, about half its picks were within a nat of the next candidate);
    Gemma's answers here loop, sure of every token."""

    def entry(**settings: Any) -> ModelConfig:
        config = {"model_path": default_model_path(), "context_window": 4096, "n_seq_max": 4}
        # DRY off: greedy is a pure argmax.
        sampling = {"sampling": {"dry_multiplier": 0.0}, "draft_strategy": "near-misses"}
        return ModelConfig.model_validate({**config, **sampling, **settings})

    config = KronkConfig(
        base_path=tmp_path_factory.mktemp("kronk-near-misses"),
        models={"near-misses": entry(cache="none"), "near-misses-imc": entry(**NO_HOST_TIER)},
    )
    with Kronk(config, plugins={"near-misses": NearMissesPlugin()}) as kronk:
        yield kronk


@pytest.mark.parametrize("model", ["near-misses", "near-misses-imc"])
async def test_drafts_of_the_targets_second_choices_never_stand(
    hesitant: Kronk, model: str
) -> None:
    """Wherever the target hesitates, the draft is its second choice: greedy output is still
    the target's first choice, token for token, turn after turn (a rule that let near
    misses stand fails)."""
    conversations = [user(STORY), user("Explain why the sky is blue.")]
    replayed = Replayed(hesitant, model)
    strategy = replayed.loaded.engine.draft_strategy
    assert isinstance(strategy, NearMisses)
    rejected = 0
    held: list[list[int]] = []  # each conversation's slot after the last turn
    engine = replayed.loaded.engine
    try:
        for _ in range(2):
            prompts = [prompt_of(hesitant, model, messages) for messages in conversations]
            results = await replayed.ask(conversations, max_tokens=120)
            rejected += sum(result.usage.rejected_prediction_tokens for result in results)
            assert sum(result.usage.accepted_prediction_tokens for result in results) > 60
            if held and model == "near-misses-imc":
                # The next turn keeps what it shares with the slot: the last prompt, and the
                # answer as far as its text tokenizes to the tokens picked (an answer that
                # picked another tokenization early leaves less than cache_min_tokens).
                for tokens, prompt, result in zip(held, prompts, results, strict=True):
                    shared = min(common_prefix(tokens, prompt), len(prompt) - 1)
                    assert result.usage.cached_tokens == (shared if shared >= 100 else 0)
            held = [list(engine.slots[replayed.slot_of(prompt)].tokens) for prompt in prompts]
            for messages, result in zip(conversations, results, strict=True):
                messages += [
                    {"role": "assistant", "content": result.content},
                    {"role": "user", "content": "Tell me more."},
                ]
    finally:
        replayed.close()
    # Batches differ run to run (two conversations at once), so the count is over both turns.
    assert rejected >= 20
    assert strategy.second_choices >= 40


# ---- sampling: the accepted tokens are distributed as the target's ----------------------

SAMPLED = SamplingParams(temperature=1.0, top_k=4, top_p=1.0, dry_multiplier=0.0)
RUNS = 240


def decode_alone(model: LlamaTextModel, tokens: list[int]) -> int:
    """Decode `tokens` on a context of their own; the row of the last one's logits."""
    model.seq_remove(0, 0, -1)
    batch = Batch()
    for position, token in enumerate(tokens):
        batch.add(token, position, 0, position == len(tokens) - 1)
    model.decode(batch)
    return len(tokens) - 1


def distribution(
    model: LlamaTextModel, stages: list[SamplerStage], tokens: list[int]
) -> dict[int, float]:
    """What `stages` draw from after `tokens`, decoded on a context of their own."""
    row = decode_alone(model, tokens)
    sampler = model.new_sampler(stages)
    try:
        found = sampler.distribution(row, 64)
    finally:
        sampler.close()
    assert found is not None
    return dict(zip(found.tokens, found.probs, strict=True))


@dataclass
class Expected:
    """The first two answer tokens' exact distribution (by text), and how often a draft of
    the second stands: the draft model's sampled one under min(1, p/q), and were it kept
    only where the target drew it too (sum of p x q); a repeat of the first token."""

    pairs: dict[tuple[str, str], float]
    acceptance: float
    matching: float
    repeated: float


def expected_answers(config: ModelConfig, draft_path: Path, prompt: list[int]) -> Expected:
    target = LlamaTextModel(config.model_copy(update={"id": "target", "n_seq_max": 1}))
    draft = LlamaTextModel(
        config.model_copy(update={"id": "draft", "model_path": draft_path, "n_seq_max": 1})
    )
    try:
        pairs: Counter[tuple[str, str]] = Counter()
        acceptance = matching = repeated = 0.0
        target_stages, draft_chain = default_stages(SAMPLED), draft_stages(SAMPLED)
        for first, p_first in distribution(target, target_stages, prompt).items():
            p = distribution(target, target_stages, [*prompt, first])
            q = distribution(draft, draft_chain, [*prompt, first])
            for second, p_second in p.items():
                pairs[(target.token_text(first), target.token_text(second))] += p_first * p_second
            acceptance += p_first * sum(min(p[t], q.get(t, 0.0)) for t in p)
            matching += p_first * sum(p[t] * q.get(t, 0.0) for t in p)
            repeated += p_first * p.get(first, 0.0)
        return Expected(dict(pairs), acceptance, matching, repeated)
    finally:
        target.close()
        draft.close()


def chi_square_critical(dof: int, z: float = 3.72) -> float:
    """The chi-square quantile at p = 1e-4 (z), by Wilson and Hilferty's approximation."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


@pytest.mark.parametrize("model", ["draft", "repeat-last"])
async def test_sampled_answers_keep_the_targets_distribution(
    models: Kronk, gemma_draft_path: Path, model: str
) -> None:
    """At temperature 1 the answer's first two tokens must be distributed as the target's,
    computed exactly here, and drafts must stand as often as the rule says.

    The draft model samples its guess from its own q: min(1, p/q) acceptance and the
    max(0, p - q) correction. repeat-last guesses the first token again, deterministically:
    the target's chain draws, and the guess stands where it drew the same token.
    """
    conversation = user("Name one colour.")
    loaded = models.load(model)
    request = models.chat_request(conversation, model=model)
    prompt = loaded.render(request.messages, models.render_options(request))
    expected = expected_answers(loaded.config, gemma_draft_path, prompt)
    sampling = {
        "temperature": SAMPLED.temperature,
        "top_k": SAMPLED.top_k,
        "top_p": SAMPLED.top_p,
        "max_tokens": 3,  # after the first token, one draft token fits
    }
    results = await asyncio.gather(
        *(ask(models, model, conversation, seed=seed, **sampling) for seed in range(RUNS))
    )
    observed = Counter((r.logprobs[0].token, r.logprobs[1].token) for r in results)
    # Cells expected fewer than 5 times are pooled, as the chi-square test needs.
    common = {pair for pair, p in expected.pairs.items() if p * RUNS >= 5}
    statistic = sum(
        (observed[pair] - RUNS * expected.pairs[pair]) ** 2 / (RUNS * expected.pairs[pair])
        for pair in common
    )
    rest = 1 - sum(expected.pairs[pair] for pair in common)
    rest_observed = RUNS - sum(observed[pair] for pair in common)
    assert len(common) >= 3 and rest * RUNS >= 5
    statistic += (rest_observed - RUNS * rest) ** 2 / (RUNS * rest)
    assert statistic < chi_square_critical(len(common))
    accepted = sum(r.usage.accepted_prediction_tokens for r in results)
    drafted = accepted + sum(r.usage.rejected_prediction_tokens for r in results)
    rate = expected.acceptance if model == "draft" else expected.repeated
    spread = max(3.0, 4 * math.sqrt(drafted * rate * (1 - rate)))
    assert drafted >= RUNS * 0.9  # a draft in (almost) every answer
    assert abs(accepted - drafted * rate) < spread
    if model == "draft":
        # Far more than were the sampled guesses kept only where the target drew them too.
        assert accepted > drafted * expected.matching + spread


def test_the_trim_floor_counts_window_cells_llama_cpp_reused(gemma_path: str) -> None:
    """Even a full-size window cache (swa_full) loses positions that left the window once
    llama.cpp's search for free cells passes them: a cut must not go below them. (The draft
    model relies on it to know when its sequence must be decoded again.)"""
    config = ModelConfig.model_validate(
        {
            "id": "m",
            "model_path": gemma_path,
            "context_window": 2048,
            "n_seq_max": 2,
            "llamacpp": {"swa_full": True},
        }
    )
    model = LlamaTextModel(config)
    try:
        tokens = model.tokenize("hello world " * 600, add_special=False, parse_special=False)

        def decode(seq: int, start: int, count: int) -> None:
            batch = Batch()
            for position in range(start, start + count):
                batch.add(tokens[position], position, seq, False)
            model.decode(batch)

        decode(1, 0, 40)  # a short request takes the first cells
        decode(0, 0, 900)  # a long conversation the next ones
        model.seq_remove(1, 0, -1)  # the short one ends: llama.cpp searches from cell 0 again
        decode(1, 0, 40)
        for position in range(900, 960):
            decode(0, position, 1)
        assert model.trim_floor(1) == 0
        assert model.trim_floor(0) > 512  # positions below ~60 went: cuts must keep a window
    finally:
        model.close()


# ---- the hook: a third-party draft strategy ---------------------------------------------


class RepeatLast:
    """Proposes the last token again and again: almost always wrong, never harmful."""

    name = "repeat-last"
    ndraft = 3
    adaptive = False
    reproducible = False

    def __init__(self) -> None:
        self.requests: list[DraftRequest] = []
        self.closed = False

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        self.requests.extend(requests)
        return [Draft((r.context[-1],) * r.max_tokens) for r in requests]

    def close(self) -> None:
        self.closed = True


class RepeatLastPlugin:
    def __init__(self) -> None:
        self.strategies: list[RepeatLast] = []

    @hookimpl
    def kronk_register_draft_strategies(self, register: Register[Any]) -> None:
        def factory(**_: Any) -> DraftStrategy:
            self.strategies.append(RepeatLast())
            return self.strategies[-1]

        register("repeat-last", factory)


async def test_a_third_party_draft_strategy_is_called_through_the_hook(
    gemma_path: str, tmp_path: Path
) -> None:
    plugin = RepeatLastPlugin()
    settings = {"model_path": gemma_path, **BASE, "cache": "none"}
    config = KronkConfig(
        base_path=tmp_path,
        models={"mine": ModelConfig.model_validate({**settings, "draft_strategy": "repeat-last"})},
    )
    with Kronk(config, plugins={"repeat": plugin}) as kronk:
        assert kronk.registry("draft_strategies").owners["repeat-last"] == "repeat"
        replayed = Replayed(kronk, "mine")
        try:
            (mine,) = await replayed.ask([user(STORY)], max_tokens=60)
        finally:
            replayed.close()
        assert mine.usage.rejected_prediction_tokens > 0
        (strategy,) = plugin.strategies
        prompt = mine.usage.prompt_tokens
        for request in strategy.requests:
            assert 1 <= request.max_tokens <= RepeatLast.ndraft
            assert len(request.context) > prompt  # the prompt, then the token decoded now
            assert request.sampling.temperature == 0
        kronk.unload("mine")
        assert strategy.closed


# ---- usage and slot state over HTTP -------------------------------------------------------


async def test_openai_usage_and_slot_state_report_the_draft_tokens(
    models: Kronk, serve: Any
) -> None:
    models.load("plain")  # a model without speculation, whose slots report no acceptance
    app = create_app(ServerSettings(), kronk=models)
    with serve(app, lifespan="off") as base_url:
        client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused")
        messages: Any = user(edit("eta", 6))
        answer = await client.chat.completions.create(
            model="lookup", messages=messages, max_tokens=120, temperature=0
        )
        assert answer.usage is not None and answer.usage.completion_tokens_details is not None
        details = answer.usage.completion_tokens_details
        assert details.accepted_prediction_tokens and details.accepted_prediction_tokens > 0
        assert details.rejected_prediction_tokens is not None
        stream = await client.chat.completions.create(
            model="lookup",
            messages=messages,
            max_tokens=120,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        usages = [chunk.usage async for chunk in stream if chunk.usage is not None]
        assert usages[-1].completion_tokens_details == details
        async with httpx.AsyncClient(base_url=base_url) as http:
            slots = (await http.get("/v1/kronk/slots")).json()["data"]
        (lookup,) = [entry for entry in slots if entry["model"] == "lookup"]
        used = [s for s in lookup["slots"] if s["accepted_prediction_tokens"]]
        last = min(used, key=lambda slot: slot["idle_seconds"])  # the slot of the stream
        assert last["accepted_prediction_tokens"] == details.accepted_prediction_tokens
        assert last["rejected_prediction_tokens"] == details.rejected_prediction_tokens
        assert 0.0 <= last["draft_acceptance"] <= 1.0
        plain = [entry for entry in slots if entry["model"] == "plain"]
        assert all(s["draft_acceptance"] is None for s in plain[0]["slots"])


# ---- bad configuration -----------------------------------------------------------------


def loading(
    tmp_path: Path, gemma_path: str, speculation: dict[str, Any], **others: ModelConfig
) -> Kronk:
    config = KronkConfig(
        base_path=tmp_path,
        models={
            "m": ModelConfig.model_validate(
                {"model_path": gemma_path, **BASE, "cache": "none", **speculation}
            ),
            **others,
        },
    )
    return Kronk(config)


def load_error(kronk: Kronk) -> KronkError:
    with kronk, pytest.raises(KronkError) as raised:
        kronk.load("m")
    assert kronk.loaded_models() == []
    return raised.value


def test_a_draft_with_another_vocabulary_is_refused_naming_both(
    tmp_path: Path, gemma_path: str, other_vocabulary_path: Path
) -> None:
    other = ModelConfig(model_path=other_vocabulary_path, context_window=256)
    speculation = {**DRAFT, "speculative": {"model-id": "bert-vocab"}}
    kronk = loading(tmp_path, gemma_path, speculation, **{"bert-vocab": other})
    error = load_error(kronk)
    assert isinstance(error, ConfigError)
    assert error.key == "models.m.speculative.model_id"
    assert "'bert-vocab' does not share the vocabulary of 'm'" in error.message
    assert "'m' has a llama tokenizer (default), 262144 tokens" in error.message
    assert "'bert-vocab' has a bert tokenizer, 30522 tokens" in error.message


def test_a_draft_model_that_does_not_load_fails_the_load_clearly(
    tmp_path: Path, gemma_path: str, minilm_path: Path
) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    drafts = {
        "broken": ModelConfig(model_path=broken),
        "embedder": ModelConfig(model_path=minilm_path),
    }
    cases = [
        ("missing", ConfigError, "draft model 'missing': model 'missing' not found"),
        ("broken", ModelLoadError, "could not load the draft model: model_path: could not"),
        ("embedder", ConfigError, "'embedder' is an embedding model, not a text model"),
    ]
    for model_id, kind, message in cases:
        speculation = {**DRAFT, "speculative": {"model-id": model_id}}
        error = load_error(loading(tmp_path, gemma_path, speculation, **drafts))
        assert isinstance(error, kind)
        assert error.message.startswith("models.m.speculative.model_id: ")
        assert message in error.message


@pytest.mark.parametrize(
    ("speculation", "message"),
    [
        ({"draft_strategy": "medusa"}, "models.m.draft_strategy: no active plugin registers"),
        ({"draft_strategy": "draft"}, "models.m.speculative.model_id: the draft strategy needs"),
        (
            {"draft_strategy": "lookup", "speculative": {"model-id": "x"}},
            "models.m.speculative.model_id: is not read by the 'lookup' draft strategy",
        ),
        (
            {"draft_strategy": "draft", "speculative": {"model-id": "x", "ngram_max": 3}},
            "models.m.speculative.ngram_max: is not read by the 'draft' draft strategy",
        ),
    ],
)
def test_a_bad_draft_strategy_fails_the_load_naming_the_key(
    tmp_path: Path, gemma_path: str, speculation: dict[str, Any], message: str
) -> None:
    assert load_error(loading(tmp_path, gemma_path, speculation)).message.startswith(message)


def test_prompt_lookup_is_on_unless_a_model_says_none(tmp_path: Path, gemma_path: str) -> None:
    for speculation, strategy in [({}, "lookup"), ({"draft_strategy": "none"}, None)]:
        with loading(tmp_path, gemma_path, speculation) as kronk:
            drafter = kronk.load("m").engine.draft_strategy
            assert (drafter and drafter.name) == strategy


def test_the_manuals_draft_model_block_turns_the_draft_model_on(
    tmp_path: Path, gemma_path: str, gemma_draft_path: Path
) -> None:
    block = {"draft-model": {"model-id": "small", "ndraft": 3, "ngpu-layers": -1, "device": ""}}
    kronk = loading(tmp_path, gemma_path, block, small=ModelConfig(model_path=gemma_draft_path))
    with kronk:
        strategy = kronk.load("m").engine.draft_strategy
        assert strategy is not None
        assert (strategy.name, strategy.ndraft) == ("draft", 3)


def test_ndraft_out_of_range_is_refused_before_anything_loads(
    tmp_path: Path, gemma_path: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        loading(tmp_path, gemma_path, {**LOOKUP, "speculative": {"ndraft": 64}})
    assert raised.value.key == "models.m.speculative.ndraft"
    assert "less than or equal to 32" in raised.value.message


async def test_a_failed_draft_load_is_a_clear_http_error(
    tmp_path: Path, gemma_path: str, other_vocabulary_path: Path, serve: Any
) -> None:
    speculation = {**DRAFT, "speculative": {"model-id": "bert-vocab"}}
    other = ModelConfig(model_path=other_vocabulary_path, context_window=256)
    kronk = loading(tmp_path, gemma_path, speculation, **{"bert-vocab": other})
    with serve(create_app(ServerSettings(), kronk=kronk)) as base_url:
        client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.InternalServerError) as raised:
            await client.chat.completions.create(model="m", messages=user("Hi"), max_tokens=4)
    # The message is in the server's log; a 500 says only its code (see security.md).
    assert "config_error" in str(raised.value)
