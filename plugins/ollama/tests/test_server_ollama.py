"""The Ollama dialect on a real server, driven by the official `ollama` client, on the default
model (SmolLM2-135M-Instruct) and MiniLM for embeddings."""

from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import jsonschema
import ollama
import pytest

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_core.contract.media import Media
from kronk_llamacpp.packaged import DEFAULT_MODEL_ID
from kronk_testing.media_samples import image as image_bytes
from kronk_testing.tool_results import MORE, tokens_of_more

if TYPE_CHECKING:
    from kronk_testing.plugin import MultimodalPaths
    from kronk_testing.server import Serve

MODEL = DEFAULT_MODEL_ID + ":latest"
GREEDY = {"temperature": 0, "num_predict": 24}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": WEATHER_SCHEMA,
    },
}


def _kronk(base: Path, minilm_path: Path) -> Kronk:
    return Kronk(
        KronkConfig(
            base_path=base,
            models={
                DEFAULT_MODEL_ID: ModelConfig(context_window=2048, n_seq_max=2),
                "minilm": ModelConfig(model_path=minilm_path, n_seq_max=2),
            },
        )
    )


@pytest.fixture(scope="module")
def base_url(
    tmp_path_factory: pytest.TempPathFactory, serve: Serve, minilm_path: Path
) -> Iterator[str]:
    base = tmp_path_factory.mktemp("ollama-home")
    with serve(create_app(ServerSettings(base_path=base), kronk=_kronk(base, minilm_path))) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url: str) -> ollama.Client:
    return ollama.Client(host=base_url, timeout=120)


def _wait_until(check: Any, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def _loaded(client: ollama.Client) -> list[str | None]:
    return [model.model for model in client.ps().models]


# ---- models ---------------------------------------------------------------------------


def test_version_is_open_and_semver(base_url: str) -> None:
    answer = httpx.get(base_url + "/api/version")
    assert answer.status_code == 200
    major, minor, _ = answer.json()["version"].split(".")
    assert (int(major), int(minor)) >= (0, 5)  # what clients need for structured outputs


def test_list_names_models_with_the_latest_tag_and_their_files(client: ollama.Client) -> None:
    models = {model.model: model for model in client.list().models}
    default = models[MODEL]
    assert default.size is not None and 50_000_000 < default.size < 200_000_000
    assert default.details is not None
    assert default.details.format == "gguf"
    assert default.details.family == "llama"
    assert default.details.quantization_level == "Q4_1"
    assert default.details.parameter_size == "134.52M"
    assert default.digest and len(default.digest) == 64
    assert "minilm:latest" in models


def test_show_reads_the_file_and_the_loaded_template(client: ollama.Client) -> None:
    client.generate(model=MODEL, keep_alive="10m")  # loads it
    shown = client.show(MODEL)
    assert shown.capabilities == ["completion", "tools"]
    assert shown.details is not None and shown.details.family == "llama"
    assert shown.modelinfo is not None
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] == 8192
    assert shown.template is not None and "<|im_start|>" in shown.template
    assert client.show("minilm").capabilities == ["embedding"]


def test_ps_lists_the_loaded_model_with_its_expiry(client: ollama.Client) -> None:
    client.generate(model=MODEL, keep_alive="10m")
    [running] = [model for model in client.ps().models if model.model == MODEL]
    assert running.size is not None and running.size > 50_000_000
    assert running.context_length == 2048
    assert running.expires_at is not None
    left = (running.expires_at - datetime.now(UTC)).total_seconds()
    assert 500 < left <= 600
    client.generate(model=MODEL, keep_alive=-1)
    [running] = [model for model in client.ps().models if model.model == MODEL]
    assert running.expires_at is not None and running.expires_at.year == 9999


# ---- chat and generate ---------------------------------------------------------------------


def test_chat_streamed_and_whole_say_the_same(client: ollama.Client) -> None:
    whole = client.chat(model=MODEL, messages=QUESTION, options=GREEDY, stream=False)
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.message.role == "assistant" and whole.message.content
    assert whole.model == MODEL
    pieces = list(client.chat(model=MODEL, messages=QUESTION, options=GREEDY, stream=True))
    assert len(pieces) > 2 and not any(piece.done for piece in pieces[:-1])
    assert "".join(piece.message.content or "" for piece in pieces) == whole.message.content
    final = pieces[-1]
    assert final.done and final.done_reason == whole.done_reason
    assert final.prompt_eval_count == whole.prompt_eval_count and final.prompt_eval_count
    assert final.eval_count == whole.eval_count and 0 < final.eval_count <= 24
    for duration in ("total_duration", "prompt_eval_duration", "eval_duration"):
        assert getattr(final, duration) > 0, duration
    assert final.total_duration is not None and final.eval_duration is not None
    assert final.total_duration > final.eval_duration
    assert final.load_duration is not None and final.load_duration >= 0


def test_num_predict_stops_with_length(client: ollama.Client) -> None:
    answer = client.chat(model=MODEL, messages=QUESTION, options={"num_predict": 3})
    assert answer.done_reason == "length"
    assert answer.eval_count == 3


def test_stream_is_ndjson_and_headers_say_so(base_url: str) -> None:
    body = {"model": MODEL, "messages": QUESTION, "options": GREEDY}
    with httpx.stream("POST", base_url + "/api/chat", json=body, timeout=120) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in answer.iter_lines() if line]
    assert lines[-1]["done"] is True
    assert all(line["done"] is False for line in lines[:-1])


def test_generate_answers_a_prompt_and_a_raw_prompt(client: ollama.Client) -> None:
    answer = client.generate(
        model=MODEL, prompt="What is the capital of France?", system="Be brief.", options=GREEDY
    )
    assert answer.done and answer.response
    streamed = client.generate(
        model=MODEL,
        prompt="What is the capital of France?",
        system="Be brief.",
        options=GREEDY,
        stream=True,
    )
    assert "".join(piece.response or "" for piece in streamed) == answer.response
    # The same prompt as the model's chat template writes it, sent as it is.
    templated = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    raw = client.generate(model=MODEL, prompt=templated, raw=True, options=GREEDY)
    assert raw.response == answer.response


def test_format_schema_gives_json_that_matches(client: ollama.Client) -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "country": {"type": "string", "maxLength": 20},
        },
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    answer = client.chat(
        model=MODEL, messages=QUESTION, format=schema, options={"temperature": 0}
    )
    jsonschema.validate(json.loads(answer.message.content or ""), schema)
    # "json" asks for any object: the tiny model may not close it within num_predict.
    answer = client.generate(
        model=MODEL, prompt="Describe Paris in JSON.", format="json", options={"num_predict": 40}
    )
    assert (answer.response or "").startswith("{")


def test_named_tool_choice_comes_back_as_a_call_with_object_arguments(base_url: str) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the weather in Oslo?"}],
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "options": {"temperature": 0, "num_predict": 60},
        "stream": False,
    }
    answer = ollama.ChatResponse.model_validate(
        httpx.post(base_url + "/api/chat", json=body, timeout=120).json()
    )
    [call] = answer.message.tool_calls or []
    assert call.function.name == "get_weather"
    assert isinstance(call.function.arguments, dict)
    jsonschema.validate(dict(call.function.arguments), WEATHER_SCHEMA)
    assert answer.done_reason == "stop"


def test_tool_calls_and_results_in_history_reach_the_prompt(
    client: ollama.Client, base_url: str
) -> None:
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "18 C, sunny", "tool_name": "get_weather"},
    ]
    answer = client.chat(model=MODEL, messages=messages, tools=[WEATHER_TOOL], options=GREEDY)
    assert answer.done
    # The result reached the prompt: a longer one makes it longer by the tokens added.
    longer = [*messages[:-1], {**messages[-1], "content": "18 C, sunny" + MORE}]
    options = {**GREEDY, "num_predict": 1}
    again = client.chat(model=MODEL, messages=longer, tools=[WEATHER_TOOL], options=options)
    assert again.prompt_eval_count is not None and answer.prompt_eval_count is not None
    added = again.prompt_eval_count - answer.prompt_eval_count
    assert added == tokens_of_more(base_url, DEFAULT_MODEL_ID)


def test_keep_alive_zero_unloads_after_the_answer(client: ollama.Client) -> None:
    client.chat(model=MODEL, messages=QUESTION, options={"num_predict": 2}, keep_alive="10m")
    assert MODEL in _loaded(client)
    client.chat(model=MODEL, messages=QUESTION, options={"num_predict": 2}, keep_alive=0)
    assert _wait_until(lambda: MODEL not in _loaded(client))
    # `ollama run` loads with an empty request, `ollama stop` unloads with keep_alive 0.
    loaded = client.generate(model=MODEL)
    assert loaded.done_reason == "load" and MODEL in _loaded(client)
    unloaded = client.generate(model=MODEL, keep_alive=0)
    assert unloaded.done_reason == "unload"
    assert _wait_until(lambda: MODEL not in _loaded(client))


def test_logprobs_come_with_each_piece(client: ollama.Client) -> None:
    answer = client.chat(
        model=MODEL, messages=QUESTION, options=GREEDY, logprobs=True, top_logprobs=3
    )
    assert answer.logprobs is not None and len(answer.logprobs) == answer.eval_count
    first = answer.logprobs[0]
    assert first.logprob <= 0 and len(first.top_logprobs or []) == 3
    assert "".join(entry.token for entry in answer.logprobs) == answer.message.content


async def test_images_reach_the_model_s_projector(
    tmp_path_factory: pytest.TempPathFactory, serve: Serve, multimodal_paths: MultimodalPaths
) -> None:
    base = tmp_path_factory.mktemp("ollama-media")
    settings = {"templates": {"template": "gemma"}, "context_window": 2048, "n_seq_max": 1}
    entry = {"model_path": multimodal_paths.model, "projector_path": multimodal_paths.both}
    kronk = Kronk(
        KronkConfig(base_path=base, models={"mm": ModelConfig.model_validate(entry | settings)})
    )
    picture = image_bytes((10, 120, 240))
    with serve(create_app(ServerSettings(base_path=base), kronk=kronk)) as url:
        client = ollama.Client(host=url, timeout=120)
        answer = client.chat(
            model="mm",
            messages=[{"role": "user", "content": "Look:", "images": [picture]}],
            options={"num_predict": 2},
        )
        # The image goes before the message's text.
        request = kronk.chat_request(
            [{"role": "user", "content": [Media.from_bytes(picture), "Look:"]}], model="mm"
        )
        expected = await kronk.count_prompt_tokens(request, add_generation_prompt=True)
        assert answer.prompt_eval_count == expected
        assert client.show("mm").capabilities == ["completion", "tools", "vision", "audio"]


# ---- embeddings ----------------------------------------------------------------------------


def test_embed_gives_unit_vectors_in_input_order(client: ollama.Client) -> None:
    answer = client.embed(model="minilm", input=["a cat", "a dog", "a cat"])
    assert len(answer.embeddings) == 3
    first, second, third = answer.embeddings
    assert len(first) == 384
    assert math.isclose(sum(value * value for value in first), 1.0, rel_tol=1e-4)
    assert first == pytest.approx(third, abs=1e-6) and first != pytest.approx(second, abs=1e-3)
    assert answer.prompt_eval_count and answer.prompt_eval_count > 3
    legacy = client.embeddings(model="minilm:latest", prompt="a cat")
    assert list(legacy.embedding) == pytest.approx(first, abs=1e-6)


def test_embed_keep_alive_zero_unloads_the_embedding_model(client: ollama.Client) -> None:
    client.embed(model="minilm", input="a cat", keep_alive=0)
    assert _wait_until(lambda: "minilm:latest" not in _loaded(client))


# ---- errors --------------------------------------------------------------------------------


def test_unknown_model_is_a_404_in_ollama_s_shape(client: ollama.Client, base_url: str) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model="no-such-model", messages=QUESTION)
    assert caught.value.status_code == 404
    assert "no-such-model" in caught.value.error
    for path, body in (
        ("/api/chat", {"model": "no-such-model", "messages": QUESTION}),
        ("/api/generate", {"model": "no-such-model", "prompt": "hi"}),
        ("/api/embed", {"model": "no-such-model", "input": "hi"}),
        ("/api/show", {"model": "no-such-model"}),
    ):
        answer = httpx.post(base_url + path, json=body)
        assert answer.status_code == 404, path
        assert list(answer.json()) == ["error"], path


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"temperature": "hot"}, "options.temperature"),
        ({"top_p": 0}, "options.top_p"),
        ({"num_predict": 0}, "num_predict"),
        ({"mirostat": 3}, "options.mirostat"),
        ({"mirostat_eta": 0}, "options.mirostat_eta"),
        ({"mirostat_tau": -1}, "options.mirostat_tau"),
        ({"typical_p": 0}, "options.typical_p"),
        ({"min_keep": -1}, "options.min_keep"),
        ({"tfs_z": 0.5}, "options.tfs_z"),
        ({"no_such_option": 1}, "options.no_such_option"),
    ],
)
def test_bad_options_are_400s_that_name_them(
    base_url: str, options: dict[str, Any], named: str
) -> None:
    body = {"model": MODEL, "messages": QUESTION, "options": options}
    answer = httpx.post(base_url + "/api/chat", json=body)
    assert answer.status_code == 400
    assert named in answer.json()["error"]


def test_typical_p_and_mirostat_options_reach_the_sampler(client: ollama.Client) -> None:
    """Ollama's names for them: typical_p, mirostat, mirostat_tau, mirostat_eta (and
    min_keep). typical_p this small leaves one token a step, so every seed answers alike;
    Mirostat draws otherwise than plain sampling with the same seed."""
    plain = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "num_predict": 24}

    def answer(seed: int, **options: Any) -> str:
        options = plain | options | {"seed": seed}
        reply = client.chat(model=MODEL, messages=QUESTION, options=options)
        return reply.message.content or ""

    assert len({answer(seed) for seed in (1, 2, 3)}) > 1
    assert len({answer(seed, typical_p=0.001) for seed in (1, 2, 3)}) == 1
    assert len({answer(seed, typical_p=0.001, min_keep=5) for seed in (1, 2, 3)}) > 1
    mirostat = {"mirostat": 2, "mirostat_tau": 1.0, "mirostat_eta": 0.2}
    assert answer(1, **mirostat) == answer(1, **mirostat) != answer(1)


def test_load_time_options_are_ignored(client: ollama.Client) -> None:
    options = {**GREEDY, "num_ctx": 8192, "num_thread": 2, "use_mmap": True}
    assert client.chat(model=MODEL, messages=QUESTION, options=options).done


@pytest.mark.parametrize(
    "extra",
    [{"suffix": "end"}, {"template": "{{ .Prompt }}"}, {"context": [1, 2, 3]}],
)
def test_generate_refuses_what_it_cannot_honour(base_url: str, extra: dict[str, Any]) -> None:
    body = {"model": MODEL, "prompt": "hi", **extra}
    answer = httpx.post(base_url + "/api/generate", json=body)
    assert answer.status_code == 400
    assert next(iter(extra)) in answer.json()["error"]


def test_bad_keep_alive_is_a_400(base_url: str) -> None:
    body = {"model": MODEL, "messages": QUESTION, "keep_alive": "soon"}
    answer = httpx.post(base_url + "/api/chat", json=body)
    assert answer.status_code == 400
    assert "keep_alive" in answer.json()["error"]


def test_an_image_for_a_model_without_a_projector_is_a_400(client: ollama.Client) -> None:
    image = base64.b64encode(image_bytes((200, 30, 30))).decode()
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(
            model=MODEL,
            messages=[{"role": "user", "content": "What is this?", "images": [image]}],
        )
    assert caught.value.status_code == 400


# ---- authentication ------------------------------------------------------------------------


def test_auth_requires_a_token_with_the_grant(
    tmp_path_factory: pytest.TempPathFactory, serve: Serve, minilm_path: Path
) -> None:
    base = tmp_path_factory.mktemp("ollama-auth")
    settings = ServerSettings(base_path=base, sections={"auth-jwt": {"enabled": True}})
    with serve(create_app(settings, kronk=_kronk(base, minilm_path))) as url:
        admin = (base / "keys" / "master.jwt").read_text()

        def mint(endpoints: str) -> str:
            answer = httpx.post(
                url + "/v1/kronk/security/tokens",
                json={"duration": "1h", "endpoints": endpoints},
                headers={"Authorization": f"Bearer {admin}"},
            )
            assert answer.status_code == 201, answer.text
            token: str = answer.json()["token"]
            return token

        assert httpx.get(url + "/api/version").status_code == 200
        with pytest.raises(ollama.ResponseError) as caught:
            ollama.Client(host=url).list()
        assert caught.value.status_code == 401
        chat_only = ollama.Client(
            host=url, headers={"Authorization": f"Bearer {mint('ollama-chat')}"}
        )
        assert chat_only.list().models
        answer = chat_only.chat(model=MODEL, messages=QUESTION, options={"num_predict": 2})
        assert answer.done
        with pytest.raises(ollama.ResponseError) as caught:
            chat_only.embed(model="minilm", input="a cat")
        assert caught.value.status_code == 403
        refused = httpx.post(url + "/api/generate", json={"model": MODEL, "prompt": "hi"})
        assert refused.status_code == 401 and list(refused.json()) == ["error"]
