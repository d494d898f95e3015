"""typical_p, Mirostat and min_keep on the default model (SmolLM2-135M-Instruct) through a real
server and the official `openai` client: what they do to the answers, their bad values, and
speculative decoding staying exact under them (checked against a replay of its batches)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_core.contract.cache import PromptScope
from kronk_core.prompts import prepare_chat
from kronk_llamacpp.packaged import DEFAULT_MODEL_ID, default_model_path
from kronk_testing.replay import BatchReplay, Start, step_records

# Real models throughout: the full tier (docs/testing.md).
pytestmark = pytest.mark.model

if TYPE_CHECKING:
    from kronk_testing.plugin import MakeKronk
    from kronk_testing.server import Serve

MODEL = DEFAULT_MODEL_ID
STORY = [{"role": "user", "content": "Tell me a story about a lighthouse keeper."}]
# Every token drawn from the model's own distribution (temperature 1, no truncation, no DRY),
# unless a request turns a stage on; n=3 with a seed draws with seeds 7, 8 and 9.
PLAIN: dict[str, Any] = {
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "dry_multiplier": 0.0,
    "seed": 7,
}


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory, serve: Serve) -> Iterator[str]:
    base = tmp_path_factory.mktemp("sampling-home")
    config = KronkConfig(base_path=base, models={MODEL: ModelConfig(context_window=2048)})
    kronk = Kronk(config)
    try:
        with serve(create_app(ServerSettings(base_path=base), kronk=kronk)) as url:
            yield url
    finally:
        kronk.close()


@pytest.fixture(scope="module")
def client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=base_url + "/v1", api_key="none", max_retries=0, timeout=120
    ) as instance:
        yield instance


def answers(client: openai.OpenAI, max_tokens: int = 24, **keys: Any) -> list[Any]:
    """Three seeded choices (seeds 7, 8, 9), with their tokens' log-probabilities; the
    sampling keys Kronk adds to OpenAI's go in the body, as llama-server reads them."""
    completion = client.chat.completions.create(
        model=MODEL,
        messages=STORY,
        n=3,
        max_tokens=max_tokens,
        logprobs=True,
        extra_body=PLAIN | keys,
    )
    return list(completion.choices)


def texts(choices: list[Any]) -> list[str]:
    return [choice.message.content for choice in choices]


def mean_surprise(choices: list[Any]) -> float:
    """The answers' mean surprise per token (nats): the log of their perplexity."""
    logprobs = [token.logprob for choice in choices for token in choice.logprobs.content]
    return -sum(logprobs) / len(logprobs)


def test_typical_p_draws_from_the_typical_tokens_and_min_keep_widens_them(
    client: openai.OpenAI,
) -> None:
    plain = texts(answers(client))
    assert len(set(plain)) == 3  # three seeds, three answers
    # typical_p this small leaves one token each step, the most typical: every seed draws it.
    typical = texts(answers(client, typical_p=0.001))
    assert len(set(typical)) == 1
    greedy = client.chat.completions.create(
        model=MODEL, messages=STORY, max_tokens=24, temperature=0
    )
    assert typical[0] != greedy.choices[0].message.content  # typical, not most likely
    assert typical[0] not in plain
    # min_keep leaves five tokens each step: the seeds draw apart again.
    widened = texts(answers(client, typical_p=0.001, min_keep=5))
    assert len(set(widened)) == 3


@pytest.mark.parametrize("version", [1, 2])
def test_mirostat_holds_the_answers_surprise_near_tau(client: openai.OpenAI, version: int) -> None:
    plain = answers(client, max_tokens=48)
    low = answers(client, max_tokens=48, mirostat=version, mirostat_tau=1.0)
    high = answers(client, max_tokens=48, mirostat=version, mirostat_tau=6.0)
    assert texts(low) != texts(plain)
    # A lower target surprise gives answers of lower perplexity; a high one lets through
    # nearly all that plain sampling draws.
    assert mean_surprise(low) < mean_surprise(high)
    assert mean_surprise(low) < mean_surprise(plain)
    assert len(set(texts(high))) == 3


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("mirostat", 3),
        ("mirostat", -1),
        ("mirostat", 1.5),
        ("mirostat_tau", -1.0),
        ("mirostat_eta", 0.0),
        ("mirostat_eta", 1.5),
        ("typical_p", 0.0),
        ("typical_p", 1.5),
        ("min_keep", -1),
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_bad_values_are_400s_that_name_the_key(
    base_url: str, path: str, key: str, value: Any
) -> None:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2, key: value}
    body |= {"messages": STORY} if "chat" in path else {"prompt": "Once"}
    answer = httpx.post(base_url + path, json=body, timeout=60)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert key in error["message"]


# ---- speculative decoding stays exact --------------------------------------------------------

TEXT = (
    "The keeper climbed the stairs at dusk, lit the lamp, wound the clock, and wrote in the "
    "log that the sea was calm, the wind was from the west, and no ship had passed."
)
REPEAT = [{"role": "user", "content": f"Repeat this text exactly, twice:\n\n{TEXT}"}]


@pytest.mark.parametrize(
    "keys",
    [
        {"mirostat": 2, "mirostat_tau": 3.0},
        {"mirostat": 1, "mirostat_tau": 3.0},
        {"typical_p": 0.9, "min_keep": 2},
    ],
    ids=["mirostat-v2", "mirostat-v1", "typical"],
)
async def test_speculative_decoding_stays_exact_under_them(
    make_kronk: MakeKronk, keys: dict[str, Any]
) -> None:
    """Prompt lookup drafts from the text to repeat. Mirostat learns from every token it
    draws, so a draft token stands only where the chain, drawing at that row as it would
    without drafts, draws that very token; the replay decodes the same batches and draws
    that way: every token and log-prob must be its own."""
    entry = {
        "model_path": str(default_model_path()),
        "context_window": 2048,
        "n_seq_max": 1,
        "cache": "none",
        "draft_strategy": "lookup",
        "speculative": {"adaptive": False},
    }
    kronk = make_kronk({"lookup": entry}, load="lookup")
    loaded = kronk.get_loaded("lookup")
    assert loaded is not None
    params = {**PLAIN, "temperature": 0.3, **keys, "max_tokens": 120, "logprobs": True}
    params["top_logprobs"] = 5
    replay = BatchReplay(loaded.config)
    try:
        records = step_records(loaded.engine)
        result = await kronk.chat(REPEAT, model="lookup", **params)
        request = kronk.chat_request(REPEAT, model="lookup", **params)
        generation = prepare_chat(loaded, request, PromptScope(remember=False)).generation
        stages = loaded.engine.sampler_stages(generation.sampling)
        started = Start(generation.prompt_tokens, result, stages=stages)
        await replay.check(records, {0: started})
    finally:
        replay.close()
    assert result.usage.accepted_prediction_tokens > 10
