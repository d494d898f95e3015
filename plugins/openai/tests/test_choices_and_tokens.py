"""n > 1 choices (chat and legacy completions, best_of) and token ids (/tokenize in Kronk's
and llama-server's shapes, /detokenize), on a real server with the default model
(SmolLM2-135M-Instruct, its default cache and prompt lookup), through the official `openai`
client and httpx."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_core.runtime.reports import StepRecord
from kronk_llamacpp.packaged import DEFAULT_MODEL_ID
from kronk_testing.server import RunningServer
from kronk_testing.waiting import all_steps_reported

# Real models throughout: the full tier (docs/testing.md).
pytestmark = pytest.mark.model

if TYPE_CHECKING:
    from kronk_testing.server import Serve

MODEL = DEFAULT_MODEL_ID
SLOTS = 4
QUESTION = [{"role": "user", "content": "Write one sentence about the sea."}]
SAMPLED: dict[str, Any] = {"temperature": 1.0, "seed": 11, "max_tokens": 12}
# A character SmolLM2's byte-level tokenizer splits over several tokens.
LLAMA = "🦙"
TEXT = f"héllo {LLAMA} 世界"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, serve: Serve) -> Iterator[RunningServer]:
    base = tmp_path_factory.mktemp("choices-home")
    config = KronkConfig(
        base_path=base, models={MODEL: ModelConfig(context_window=2048, n_seq_max=SLOTS)}
    )
    kronk = Kronk(config)
    app = create_app(ServerSettings(base_path=base), kronk=kronk)
    try:
        with serve(app) as base_url:
            yield RunningServer(base_url=base_url, kronk=kronk, app=app)
    finally:
        kronk.close()


@pytest.fixture(scope="module")
def client(served: RunningServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=served.base_url + "/v1", api_key="none", max_retries=0, timeout=120
    ) as instance:
        yield instance


def _chat(client: openai.OpenAI, **params: Any) -> Any:
    return client.chat.completions.create(model=MODEL, messages=QUESTION, **SAMPLED | params)


# ---- chat completions ----------------------------------------------------------------------


async def test_n_choices_run_side_by_side_from_one_prefill_and_repeat_with_the_seed(
    served: RunningServer, client: openai.OpenAI
) -> None:
    served.kronk.load(MODEL)
    loaded = served.kronk.get_loaded(MODEL)
    assert loaded is not None
    engine = loaded.engine
    records: list[StepRecord] = []
    engine.add_step_listener(records.append)
    try:
        answer = _chat(client, n=3, logprobs=True)
        await all_steps_reported(engine, records)
    finally:
        engine.remove_step_listener(records.append)
    assert [choice.index for choice in answer.choices] == [0, 1, 2]
    contents = [choice.message.content for choice in answer.choices]
    assert all(contents) and len(set(contents)) == 3  # seed + index: each its own draws

    # Usage as OpenAI counts it: the prompt once, every choice's tokens.
    single = _chat(client, n=1)
    assert answer.usage.prompt_tokens == single.usage.prompt_tokens
    counted = sum(len(choice.logprobs.content) for choice in answer.choices)
    assert answer.usage.completion_tokens == counted
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + counted

    # One slot prefilled the prompt (what the cache did not hold); the two others copied it
    # and decoded its last token only; then all three generated in the same steps.
    prefilled: Counter[int] = Counter()
    for record in records:
        prefilled.update(record.prefilling)
    cached = answer.usage.prompt_tokens_details.cached_tokens
    assert sorted(prefilled.values()) == [1, 1, answer.usage.prompt_tokens - cached]
    assert sum(len(record.generating) == 3 for record in records) >= 10

    again = _chat(client, n=3, logprobs=True)
    assert [choice.message.content for choice in again.choices] == contents


async def test_streamed_choices_carry_their_index_and_say_what_the_whole_answer_says(
    served: RunningServer, client: openai.OpenAI
) -> None:
    whole = _chat(client, n=3)
    chunks = list(_chat(client, n=3, stream=True, stream_options={"include_usage": True}))
    texts = ["", "", ""]
    roles: Counter[int] = Counter()
    finishes: Counter[int] = Counter()
    for chunk in chunks[:-1]:
        assert len(chunk.choices) == 1
        choice = chunk.choices[0]
        if choice.delta.role is not None:
            assert texts[choice.index] == "" and not finishes[choice.index]
            roles[choice.index] += 1
        texts[choice.index] += choice.delta.content or ""
        finishes[choice.index] += choice.finish_reason is not None
        assert chunk.usage is None
    assert roles == finishes == Counter({0: 1, 1: 1, 2: 1})
    assert texts == [choice.message.content for choice in whole.choices]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    assert usage.completion_tokens == whole.usage.completion_tokens


@pytest.mark.parametrize(
    ("n", "says"),
    [(SLOTS + 1, f"has {SLOTS} (its n_seq_max)"), (0, "greater than or equal to 1"), (129, "128")],
)
def test_n_past_the_slots_or_the_limit_is_a_400_naming_it(
    client: openai.OpenAI, n: int, says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(client, n=n)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "n" or error["message"].startswith("n")
    assert says in error["message"]


# ---- legacy completions ----------------------------------------------------------------------


def test_completion_choices_and_the_best_of_them(client: openai.OpenAI) -> None:
    params: dict[str, Any] = {"model": MODEL, "prompt": "The sea is", **SAMPLED, "max_tokens": 6}
    three = client.completions.create(n=3, logprobs=1, **params)
    assert [choice.index for choice in three.choices] == [0, 1, 2]
    lengths = [len(choice.logprobs.tokens) for choice in three.choices]
    assert three.usage.completion_tokens == sum(lengths)
    assert len({choice.text for choice in three.choices}) == 3

    # best_of: the same three candidates (seed + index), the two with the highest
    # log-probability per token returned, best first; usage counts every candidate.
    best = client.completions.create(n=2, best_of=3, **params)
    per_token = sorted(
        three.choices,
        key=lambda choice: -sum(choice.logprobs.token_logprobs) / len(choice.logprobs.tokens),
    )
    assert [choice.text for choice in best.choices] == [c.text for c in per_token[:2]]
    assert [choice.index for choice in best.choices] == [0, 1]
    assert all(choice.logprobs is None for choice in best.choices)
    assert best.usage.completion_tokens == three.usage.completion_tokens

    streamed = client.completions.create(n=2, stream=True, **params)
    texts = ["", ""]
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == [choice.text for choice in three.choices[:2]]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"n": 3, "best_of": 2}, "best_of: must be at least n (3)"),
        ({"n": 1, "best_of": 2, "stream": True}, "cannot be streamed"),
        ({"n": 1, "best_of": SLOTS + 1}, f"has {SLOTS} (its n_seq_max)"),
    ],
)
def test_bad_best_of_is_a_400_naming_it(
    served: RunningServer, extra: dict[str, Any], says: str
) -> None:
    body = {"model": MODEL, "prompt": "The sea is", "max_tokens": 2, **extra}
    answer = httpx.post(served.base_url + "/v1/completions", json=body, timeout=60)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert "best_of" in (error["param"] or "") + error["message"]
    assert says in error["message"]


# ---- tokenize and detokenize -----------------------------------------------------------------


def _post(served: RunningServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(served.base_url + path, json=body, timeout=60)


def test_llama_server_s_tokenize_gives_ids_and_pieces_that_detokenize_back(
    served: RunningServer,
) -> None:
    ids = _post(served, "/tokenize", {"content": TEXT}).json()["tokens"]
    assert ids and all(isinstance(token, int) for token in ids)
    pieces = _post(served, "/tokenize", {"content": TEXT, "with_pieces": True}).json()["tokens"]
    assert [piece["id"] for piece in pieces] == ids
    # A piece that is not valid UTF-8 (part of a split character) comes as its bytes.
    split = [piece["piece"] for piece in pieces if isinstance(piece["piece"], list)]
    assert len(split) >= 2
    joined = b"".join(
        bytes(piece["piece"]) if isinstance(piece["piece"], list) else piece["piece"].encode()
        for piece in pieces
    )
    assert joined == TEXT.encode()
    assert LLAMA.encode() in b"".join(bytes(piece) for piece in split)
    for path in ("/detokenize", "/v1/detokenize"):
        assert _post(served, path, {"tokens": ids}).json() == {"content": TEXT}


def test_kronk_s_tokenize_keeps_its_count_and_adds_the_ids(served: RunningServer) -> None:
    ids = _post(served, "/tokenize", {"content": TEXT}).json()["tokens"]
    for text in ({"input": TEXT}, {"content": TEXT}):
        answer = _post(served, "/v1/tokenize", {"model": MODEL, **text}).json()
        assert answer["object"] == "tokenize" and answer["model"] == MODEL
        assert answer["tokens"] == len(ids) and answer["ids"] == ids
        assert "pieces" not in answer
    pieces = _post(served, "/v1/tokenize", {"input": TEXT, "with_pieces": True}).json()["pieces"]
    assert pieces == _post(served, "/tokenize", {"content": TEXT, "with_pieces": True}).json()[
        "tokens"
    ]
    templated = {"model": MODEL, "input": "Hello", "apply_template": True}
    answer = _post(served, "/v1/tokenize", templated).json()
    assert answer["tokens"] == len(answer["ids"]) > 5
    rendered = _post(served, "/detokenize", {"tokens": answer["ids"]}).json()["content"]
    assert "Hello" in rendered and rendered.startswith("<|im_start|>")


def test_special_tokens_are_parsed_unless_asked_not_to(served: RunningServer) -> None:
    marker = "<|im_start|>user"
    parsed = _post(served, "/tokenize", {"content": marker}).json()["tokens"]
    literal = _post(served, "/tokenize", {"content": marker, "parse_special": False}).json()
    assert len(literal["tokens"]) > len(parsed)
    plain = _post(served, "/tokenize", {"content": "Hi"}).json()["tokens"]
    special = _post(served, "/tokenize", {"content": "Hi", "add_special": True}).json()["tokens"]
    assert special[len(special) - len(plain) :] == plain


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        ("/detokenize", {"tokens": [1, 10**7]}, "tokens: token id 10000000 is not in the vocab"),
        ("/v1/detokenize", {"tokens": [-1]}, "tokens: token id -1 is not in the vocabulary"),
        ("/detokenize", {"tokens": ["1"]}, "tokens"),
        ("/tokenize", {"content": "a", "input": "b"}, "either input or content"),
        ("/v1/tokenize", {"model": MODEL}, "either input or content"),
        ("/tokenize", {"content": "a", "add_special": "yes"}, "add_special"),
    ],
)
def test_bad_token_requests_are_400s_that_say_why(
    served: RunningServer, path: str, body: dict[str, Any], says: str
) -> None:
    answer = _post(served, path, body)
    assert answer.status_code == 400
    assert says in answer.json()["error"]["message"]
