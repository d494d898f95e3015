"""Embeddings and rerank on the real converted all-MiniLM-L6-v2 and the tiny reranker.

SDK and server both; the server is a real uvicorn, driven with httpx and the official
`openai` SDK.
"""

from __future__ import annotations

import base64
import math
import struct
from typing import Any

import httpx
import pytest
from openai import OpenAI

from kronk_core import Kronk
from kronk_core.contract.errors import CapabilityError, InvalidRequestError

# Each sentence and its paraphrase; no other sentence is about the same thing.
PARAPHRASES = [
    ("The cat is sleeping on the sofa.", "A cat naps on the couch."),
    ("It is raining heavily in London today.", "London is getting a lot of rain today."),
    ("He plays the guitar every evening.", "Every night he practises guitar."),
    ("The stock market fell sharply this morning.", "Share prices dropped steeply this morning."),
    ("She is baking bread in the kitchen.", "She bakes a loaf in her kitchen."),
    ("The train to Paris was delayed by an hour.", "Our Paris train ran sixty minutes late."),
    ("Children are playing football in the park.", "Kids kick a soccer ball around the park."),
    ("The doctor prescribed antibiotics for the infection.", "The physician gave antibiotics."),
    ("I forgot my umbrella at the office.", "I left my umbrella at work."),
    ("The spacecraft landed safely on Mars.", "The probe touched down on Mars without trouble."),
]


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _norm(vector: list[float]) -> float:
    return math.sqrt(sum(x * x for x in vector))


async def test_embeddings_are_unit_length_deterministic_and_semantic(kronk: Kronk) -> None:
    texts = [text for pair in PARAPHRASES for text in pair]
    first = await kronk.embed(texts, model="minilm")
    again = await kronk.embed(texts, model="minilm")
    assert first.vectors == again.vectors
    assert all(len(vector) == 384 for vector in first.vectors)
    assert all(abs(_norm(vector) - 1.0) < 1e-5 for vector in first.vectors)
    for index in range(len(PARAPHRASES)):
        sentence = first.vectors[2 * index]
        scores = [_cosine(sentence, first.vectors[2 * other + 1]) for other in range(10)]
        assert max(range(10), key=scores.__getitem__) == index, (PARAPHRASES[index], scores)
        # ...and also closer than to any other original sentence.
        others = [_cosine(sentence, first.vectors[2 * o]) for o in range(10) if o != index]
        assert scores[index] > max(others)


async def test_a_batch_equals_one_by_one(kronk: Kronk) -> None:
    texts = [f"Sentence number {i} talks about {PARAPHRASES[i % 10][0].lower()}" for i in range(64)]
    batch = await kronk.embed(texts, model="minilm")
    tokens = 0
    for text, vector in zip(texts, batch.vectors, strict=True):
        single = await kronk.embed(text, model="minilm")
        assert _cosine(vector, single.vectors[0]) >= 0.9999
        tokens += single.prompt_tokens
    assert batch.prompt_tokens == tokens


async def test_token_inputs_match_text(kronk: Kronk) -> None:
    model = kronk.load("minilm").model
    text = "Token arrays are embedded as given."
    tokens = model.tokenize(text, add_special=True, parse_special=False)
    by_text = await kronk.embed(text, model="minilm")
    by_tokens = await kronk.embed(tokens, model="minilm")
    assert by_text.vectors == by_tokens.vectors
    with pytest.raises(InvalidRequestError, match=r"input\[0\] must hold token ids"):
        await kronk.embed([[10**9]], model="minilm")


async def test_dimensions_cut_and_renormalise(kronk: Kronk) -> None:
    full = (await kronk.embed("Matryoshka dolls nest.", model="minilm")).vectors[0]
    short = (await kronk.embed("Matryoshka dolls nest.", model="minilm", dimensions=64)).vectors[0]
    assert len(short) == 64 and abs(_norm(short) - 1.0) < 1e-5
    prefix = full[:64]
    assert _cosine(short, [x / _norm(prefix) for x in prefix]) > 0.99999
    with pytest.raises(InvalidRequestError, match="between 1 and 384"):
        await kronk.embed("x", model="minilm", dimensions=1000)
    with pytest.raises(InvalidRequestError, match="matryoshka: true"):
        await kronk.embed("x", model="minilm-plain", dimensions=64)


def _post(server: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=60)


def test_openai_sdk_float_and_base64(server: Any) -> None:
    client = OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
    texts = ["The cat is sleeping on the sofa.", "A cat naps on the couch."]
    floats = client.embeddings.create(model="minilm", input=texts, encoding_format="float")
    encoded = client.embeddings.create(model="minilm", input=texts, encoding_format="base64")
    assert [item.index for item in floats.data] == [0, 1]
    assert floats.usage.prompt_tokens == encoded.usage.prompt_tokens > 0
    for plain, packed in zip(floats.data, encoded.data, strict=True):
        # With an explicit encoding_format the SDK hands back the base64 text as sent.
        assert isinstance(packed.embedding, str)
        decoded = struct.unpack("<384f", base64.b64decode(packed.embedding))
        assert plain.embedding == pytest.approx(decoded, abs=1e-6)
        assert abs(_norm(list(decoded)) - 1.0) < 1e-5
    # Without encoding_format the SDK asks for base64 and decodes it itself.
    default = client.embeddings.create(model="minilm", input=texts)
    assert default.data[0].embedding == pytest.approx(floats.data[0].embedding, abs=1e-6)


def test_truncate_or_400_naming_the_input(server: Any) -> None:
    long_text = "word " * 700
    refused = _post(server, "/v1/embeddings", {"model": "minilm", "input": ["short", long_text]})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert "input[1]" in error["message"] and "truncate" in error["message"]
    assert error["type"] == "invalid_request_error"
    cut = _post(server, "/v1/embeddings", {"model": "minilm", "input": long_text, "truncate": True})
    assert cut.status_code == 200
    assert cut.json()["usage"]["prompt_tokens"] == 512


def test_server_dimensions(server: Any) -> None:
    ok = _post(server, "/v1/embeddings", {"model": "minilm", "input": "x", "dimensions": 32})
    assert len(ok.json()["data"][0]["embedding"]) == 32
    refused = _post(
        server, "/v1/embeddings", {"model": "minilm-plain", "input": "x", "dimensions": 32}
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "dimensions"


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        ("/v1/embeddings", {"model": "gemma-3-270m-Q4_K_M", "input": "x"}, "supports chat"),
        (
            "/v1/chat/completions",
            {"model": "minilm", "messages": [{"role": "user", "content": "hi"}]},
            "supports embeddings, not chat",
        ),
        ("/v1/rerank", {"model": "minilm", "query": "q", "documents": ["d"]}, "not rerank"),
        ("/v1/embeddings", {"model": "tiny-reranker", "input": "x"}, "supports rerank"),
    ],
)
def test_capability_errors(server: Any, path: str, body: dict[str, Any], says: str) -> None:
    response = _post(server, path, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert says in error["message"]
    assert error["code"] == CapabilityError.code


DOCUMENTS = [
    "Paris is the capital of France.",
    "The mitochondria is the powerhouse of the cell.",
    "Bananas are rich in potassium.",
    "The Eiffel Tower is in Paris.",
    "Python is a programming language.",
]


def test_rerank_order_top_n_documents_and_index(server: Any) -> None:
    body = {"model": "tiny-reranker", "query": "What is in Paris?", "documents": DOCUMENTS}
    full = _post(server, "/v1/rerank", body).json()
    results = full["results"]
    assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
    assert all(r["document"] == DOCUMENTS[r["index"]] for r in results)
    assert full["usage"]["prompt_tokens"] > 0 and full["model"] == "tiny-reranker"

    top = _post(server, "/v1/reranking", {**body, "top_n": 2, "return_documents": False}).json()[
        "results"
    ]
    assert top == [{k: v for k, v in r.items() if k != "document"} for r in results[:2]]

    as_objects = {**body, "documents": [{"text": d} for d in DOCUMENTS]}
    assert _post(server, "/v1/rerank", as_objects).json()["results"] == results


def test_rerank_scores_identical_in_one_request_or_several(server: Any) -> None:
    query = "Which fruit has potassium?"
    together = _post(
        server, "/v1/rerank", {"model": "tiny-reranker", "query": query, "documents": DOCUMENTS}
    ).json()["results"]
    by_index = {r["index"]: r["relevance_score"] for r in together}
    for index, document in enumerate(DOCUMENTS):
        alone = _post(
            server,
            "/v1/rerank",
            {"model": "tiny-reranker", "query": query, "documents": [document]},
        ).json()["results"]
        assert alone[0]["relevance_score"] == by_index[index]


def test_models_list_and_ps_show_the_pool(server: Any) -> None:
    _post(server, "/v1/embeddings", {"model": "minilm", "input": "load me"})
    cards = {card["id"]: card for card in httpx.get(f"{server.base_url}/v1/models").json()["data"]}
    assert cards["minilm"]["loaded"] is True
    pool = httpx.get(f"{server.base_url}/v1/kronk/models").json()
    entries = {entry["id"]: entry for entry in pool["data"]}
    minilm = entries["minilm"]
    assert minilm["capabilities"] == ["embeddings"] and minilm["slots"] == 2
    assert minilm["memory_bytes"] > 40 * 2**20
    assert 0 < minilm["ttl_left_seconds"] <= pool["cache_ttl_seconds"]


def test_kronk_model_ps_and_unload(server: Any) -> None:
    from click.testing import CliRunner

    from kronk_api.cli import main

    _post(server, "/v1/embeddings", {"model": "minilm-plain", "input": "load me"})
    host = server.base_url.removeprefix("http://")
    listed = CliRunner().invoke(main, ["model", "ps", "--api-host", host])
    assert listed.exit_code == 0, listed.output
    assert "TTL LEFT" in listed.output
    row = next(line for line in listed.output.splitlines() if line.startswith("minilm-plain "))
    assert "embeddings" in row and "MiB" in row

    unloaded = httpx.post(f"{server.base_url}/v1/kronk/models/minilm-plain/unload")
    assert unloaded.json() == {"id": "minilm-plain", "unloaded": True}
    assert server.kronk.pool.get("minilm-plain") is None
    again = httpx.post(f"{server.base_url}/v1/kronk/models/minilm-plain/unload")
    assert again.json()["unloaded"] is False
    missing = httpx.post(f"{server.base_url}/v1/kronk/models/nope/unload")
    assert missing.status_code == 404

    # The same through the CLI.
    _post(server, "/v1/embeddings", {"model": "minilm-plain", "input": "load me"})
    unload = ["model", "unload", "--api-host", host]
    done = CliRunner().invoke(main, [*unload, "minilm-plain"])
    assert done.exit_code == 0 and done.output == "minilm-plain: unloaded\n", done.output
    assert server.kronk.pool.get("minilm-plain") is None
    done = CliRunner().invoke(main, [*unload, "minilm-plain"])
    assert done.output == "minilm-plain: was not loaded\n", done.output
    refused = CliRunner().invoke(main, [*unload, "nope"])
    assert refused.exit_code == 1 and "404" in refused.output and "nope" in refused.output
