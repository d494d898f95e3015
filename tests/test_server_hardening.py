"""Hardening of every server, auth on or off: body limits, CORS, bind, logs, error bodies, fuzz."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from hypothesis import HealthCheck, Phase, example, find, given, settings
from hypothesis import strategies as st
from litestar import Litestar
from litestar.routes import HTTPRoute

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_llamacpp.packaged import GEMMA_MODEL_ID
from kronk_testing.file_server import FileServer, Served
from kronk_testing.fuzzing import fuzz_settings
from kronk_testing.media_samples import wav
from kronk_testing.plugin import MultimodalPaths

if TYPE_CHECKING:
    from kronk_testing.server import RunningServer, Serve

MODEL = GEMMA_MODEL_ID
FIM_MODEL = "tiny-fim"
CHAT = "/v1/chat/completions"
SECRET = "SECRET-PROMPT-7f3a"


def chat_body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}


def assert_openai_error(response: httpx.Response, status: int, *words: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert "Traceback" not in response.text
    error: dict[str, Any] = response.json()["error"]
    for word in words:
        assert word in error["message"], error
    return error


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory: pytest.TempPathFactory, serve: Serve) -> Iterator[str]:
    """Small limits, CORS for one origin, insecure logging on, a model that cannot load."""
    base = tmp_path_factory.mktemp("strict-home")
    broken = base / "broken.gguf"
    broken.write_bytes(b"not a gguf file")
    kronk = Kronk(KronkConfig(base_path=base, models={"broken": ModelConfig(model_path=broken)}))
    app = create_app(
        ServerSettings(
            base_path=base,
            max_request_bytes=64 * 1024,
            json_max_depth=8,
            json_max_string_length=1000,
            json_max_items=50,
            cors_origins="https://app.example, https://other.example",  # type: ignore[arg-type]
            insecure_logging=True,
        ),
        kronk=kronk,
    )
    with serve(app) as base_url:
        yield base_url


# ---- body limits ---------------------------------------------------------------------


def test_body_over_the_limit_is_413_in_the_dialects_shape(strict_server: str) -> None:
    big = chat_body(messages=[{"role": "user", "content": "x" * 900}] * 80)
    response = httpx.post(strict_server + CHAT, json=big)
    error = assert_openai_error(response, 413, str(64 * 1024))
    assert error["code"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while streaming
        yield b'{"model": "x", "messages": ['
        for _ in range(100):
            yield b'{"role": "user", "content": "' + b"y" * 900 + b'"},'
        yield b"{}]}"

    streamed = httpx.post(
        strict_server + CHAT, content=chunks(), headers={"content-type": "application/json"}
    )
    assert_openai_error(streamed, 413)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"[" * 9 + b"]" * 9, ("nested deeper than 8",)),
        (b"[" * 50_000, ("nested deeper than 8",)),
        (json.dumps(chat_body(stop=["z" * 1001])).encode(), ("longer than 1000",)),
        (json.dumps(chat_body(tools=[{}] * 51)).encode(), ("more than 50 items",)),
        (json.dumps({f"k{n}": n for n in range(51)}).encode(), ("more than 50 items",)),
        (b'{"model": 1' + b"1" * 5000 + b"}", ("not valid JSON",)),
        (b"\xff\xfe\x00garbage", ("not valid JSON",)),
    ],
    ids=["depth", "deep_unclosed", "string", "array", "object", "huge_int", "bytes"],
)
def test_json_shape_limits_are_400(strict_server: str, body: bytes, words: tuple[str, ...]) -> None:
    for path in (CHAT, "/v1/tokenize"):
        response = httpx.post(
            strict_server + path, content=body, headers={"content-type": "application/json"}
        )
        assert_openai_error(response, 400, *words)


def test_default_limits_take_a_base64_image(server: RunningServer) -> None:
    image = "data:image/png;base64," + "A" * (12 << 20)
    content = [{"type": "image_url", "image_url": {"url": image}}]
    response = httpx.post(
        server.base_url + CHAT,
        json=chat_body(messages=[{"role": "user", "content": content}]),
        timeout=60,
    )
    # Past every body limit; the image part itself is then refused (not an image).
    assert_openai_error(response, 400, "not a readable image")


# ---- CORS, bind, logs, error bodies -----------------------------------------------------


def test_cors_is_off_by_default_and_allows_only_configured_origins(
    server: RunningServer, strict_server: str
) -> None:
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    default = httpx.options(server.base_url + CHAT, headers=preflight)
    assert "access-control-allow-origin" not in default.headers
    plain = httpx.get(server.base_url + "/v1/liveness", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in plain.headers

    allowed = httpx.options(strict_server + CHAT, headers=preflight)
    assert allowed.headers.get("access-control-allow-origin") == "https://app.example"
    foreign = httpx.get(strict_server + "/v1/liveness", headers={"Origin": "https://evil.example"})
    assert foreign.headers.get("access-control-allow-origin") != "https://evil.example"


def test_default_bind_is_loopback() -> None:
    assert ServerSettings().host == "127.0.0.1"


def _send_secret(base_url: str) -> None:
    response = httpx.post(
        base_url + CHAT,
        json=chat_body(model="no-such-model", messages=[{"role": "user", "content": SECRET}]),
    )
    assert response.status_code == 404


def test_prompts_are_logged_only_with_insecure_logging(
    server: RunningServer, strict_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        _send_secret(server.base_url)
    assert SECRET not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _send_secret(strict_server)
    assert SECRET in caplog.text


def test_server_errors_keep_paths_in_the_log(
    strict_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        response = httpx.post(strict_server + CHAT, json=chat_body(model="broken"), timeout=60)
    error = assert_openai_error(response, 500)
    assert error["code"] == "model_load_failed"
    assert "broken.gguf" not in response.text and "/" not in error["message"]
    assert "broken.gguf" in caplog.text


# ---- fuzz: every POST endpoint of the app, with and without credentials ------------------


def post_paths(app: Litestar) -> list[str]:
    """Every POST route the app has, as its path template, whichever plugin added it."""
    paths = set()
    for route in app.routes:
        if isinstance(route, HTTPRoute) and "POST" in route.methods:
            paths.add(route.path_format)
    return sorted(paths)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


BOUNDARY = "kronk-fuzz-boundary"
FORM_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


@dataclass(frozen=True)
class FormBody:
    fields: dict[str, Any]
    file: bytes | None

    def encoded(self) -> bytes:
        parts = []
        for name, value in self.fields.items():
            text = value if isinstance(value, str) else json.dumps(value)
            head = f'Content-Disposition: form-data; name="{name}"'
            parts.append(f"--{BOUNDARY}\r\n{head}\r\n\r\n".encode() + _utf8(text) + b"\r\n")
        if self.file is not None:
            head = 'Content-Disposition: form-data; name="file"; filename="speech.wav"'
            parts.append(f"--{BOUNDARY}\r\n{head}\r\n\r\n".encode() + self.file + b"\r\n")
        return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


@st.composite
def near_valid(
    draw: st.DrawFn,
    required: dict[str, st.SearchStrategy[Any]],
    optional: dict[str, st.SearchStrategy[Any]] | None = None,
    fixed: dict[str, st.SearchStrategy[Any]] | None = None,
) -> dict[str, Any]:
    """A valid body (the required fields, some optional ones), as it is or with one change:
    a field replaced by any JSON value, a field dropped, or an unknown field added.

    `fixed` fields are never replaced or dropped (their strategy holds the wrong values
    worth trying): a body must not ask for thousands of generated tokens.
    """
    body = draw(st.fixed_dictionaries(required, optional=optional or {}))
    change = draw(st.sampled_from(["none", "none", "none", "replace", "drop", "add"]))
    if change in ("replace", "drop") and body:
        key = draw(st.sampled_from(sorted(body)))
        if change == "replace":
            body[key] = draw(JSON)
        else:
            del body[key]
    elif change == "add":
        body[draw(st.text(max_size=8))] = draw(JSON)
    return {**body, **draw(st.fixed_dictionaries(fixed or {}))}


# Strings as JSON can carry them: lone surrogates ("\\ud800") now and then.
TEXT = st.text(max_size=40) | st.text(st.characters(categories=["Cs"]), min_size=1, max_size=2)
WORDS = st.text(min_size=1, max_size=40)
NAME = st.from_regex(r"[a-z][a-z_]{0,9}", fullmatch=True)
MESSAGES = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant"]), "content": TEXT}
    ),
    min_size=1,
    max_size=3,
)
OBJECT_SCHEMA = st.just({"type": "object", "properties": {"x": {"type": "string"}}})


def _nested_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


# Schemas past the structured-output limits (each a 400 that names the limit), and a few
# the converter or llama.cpp refuse.
# A billion, as llama-cpp-python's pattern parser reads numbers (int(): signs, spaces,
# underscores), in each place of a quantifier.
BILLION = st.sampled_from(["1000000000", "+1000000000", " 1000000000 ", "1_000_000_000"])
QUANTIFIER = st.one_of(
    BILLION.map(lambda n: "{" + n + "}"),
    st.tuples(st.sampled_from(["", " ", "0", "+2"]), BILLION).map(lambda p: f"{{{p[0]},{p[1]}}}"),
)
HOSTILE_PATTERN = st.builds(
    lambda unit, quantifier: {"type": "string", "pattern": f"^{unit}{quantifier}$"},
    st.sampled_from(["a", "(ab)", "[a-z]", "."]),
    QUANTIFIER,
)
HOSTILE_SCHEMA = HOSTILE_PATTERN | st.sampled_from(
    [
        {"type": "array", "items": {"type": "integer"}, "minItems": 10**9},
        {"type": "array", "items": {}, "maxItems": 10**12},
        {"type": "string", "maxLength": 10**9},
        {"type": "string", "pattern": "^(ab){3,1000000000}$"},
        {"enum": list(range(1001))},
        {"anyOf": [{"const": index} for index in range(129)]},
        {"type": ["string"] * 129},
        {"type": "object", "properties": {f"p{index}": {} for index in range(1001)}},
        _nested_schema(20),
        {"$ref": "#/$defs/a", "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {}]}}},
        {"$ref": "https://example.com/schema.json"},
    ]
)
SCHEMA = OBJECT_SCHEMA | HOSTILE_SCHEMA
HOSTILE_GRAMMAR = st.sampled_from(
    [
        "",
        " \n",
        "root ::= " + "(" * 30_000 + '"a"' + ")" * 30_000,
        "\n".join(
            [
                'root ::= r23 "y"',
                'r0 ::= "x"?',
                *(f"r{i} ::= r{i - 1} r{i - 1}" for i in range(1, 24)),
            ]
        ),
        "\n".join(["root ::= r0", *(f"r{i} ::= r{i + 1}" for i in range(5000)), 'r5000 ::= "a"']),
        'root ::= "a"{1000000000}',
        "root ::= " + " | ".join(f'"{index}"' for index in range(300)),
    ]
)
TOOL = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": NAME, "parameters": SCHEMA}),
    }
)
# At most one of a chat's output constraints, often past a limit.
CONSTRAINT = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {"grammar": st.sampled_from(['root ::= "a"', 'root ::= [a-z]+ "."']) | HOSTILE_GRAMMAR}
    ),
    st.fixed_dictionaries({"json_schema": SCHEMA}),
    st.fixed_dictionaries(
        {
            "response_format": st.just({"type": "text"})  # json_object: see "grammar"
            | st.builds(
                lambda schema: {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": schema},
                },
                SCHEMA,
            )
        }
    ),
)
# Never null or absent: a valid body must not generate thousands of tokens.
FEW_TOKENS = st.integers(1, 3) | st.sampled_from([0, -1, "2", "x", 1.5, [], {}])
RESPONSES_INPUT = st.one_of(
    TEXT,
    st.lists(
        st.one_of(
            st.fixed_dictionaries(
                {
                    "role": st.sampled_from(["user", "system", "developer"]),
                    "content": TEXT
                    | st.lists(
                        st.fixed_dictionaries({"type": st.just("input_text"), "text": TEXT}),
                        min_size=1,
                        max_size=2,
                    ),
                },
                optional={"type": st.just("message")},
            ),
            st.fixed_dictionaries(
                {"type": st.just("function_call_output"), "call_id": NAME, "output": TEXT}
            ),
        ),
        min_size=1,
        max_size=3,
    ),
)
ANTHROPIC_MESSAGES = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.just("user"),
            "content": TEXT
            | st.lists(
                st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
                min_size=1,
                max_size=2,
            ),
        }
    ),
    min_size=1,
    max_size=2,
)
ANTHROPIC_TOOL = st.fixed_dictionaries(
    {"name": NAME, "input_schema": SCHEMA}, optional={"description": TEXT}
)
NO_BODY = st.just({})
# Ollama's options: a few tokens (-1 would mean no limit), sometimes a wrong value or key.
OLLAMA_OPTIONS = st.fixed_dictionaries(
    {"num_predict": st.integers(1, 3) | st.sampled_from([0, -3, "x", 1.5, []])},
    optional={
        "temperature": st.floats(0, 2) | st.just("hot"),
        "num_ctx": st.integers(),
        "mirostat": st.integers(0, 2),
        "bogus": JSON,
    },
)
# Near-valid bodies for every POST route. A route a plugin adds must get its entry here.
TOKEN_IDS = st.lists(st.integers(-5, 300_000), max_size=8)
KNOWN_BODIES: dict[str, st.SearchStrategy[Any]] = {
    CHAT: st.builds(
        lambda body, constraint: {**body, **constraint},
        near_valid(
            {"model": st.just(MODEL), "messages": MESSAGES},
            {
                "stream": st.booleans(),
                "stop": st.lists(st.text(min_size=1, max_size=5), max_size=4) | st.text(max_size=3),
                "temperature": st.floats(0, 2),
                "top_k": st.integers(0, 50),
                "logprobs": st.booleans(),
                "top_logprobs": st.integers(0, 5),
                "seed": st.integers(),
                "tools": st.lists(TOOL, max_size=2),
                "tool_choice": st.sampled_from(["auto", "none", "required"]),
                "n": st.integers(0, 5),
                "logit_bias": st.sampled_from(
                    [{"1": 5}, {"-1": 1}, {str(token): -1 for token in range(50_000)}]
                ),
            },
            fixed={"max_tokens": FEW_TOKENS},
        ),
        CONSTRAINT,
    ),
    "/v1/completions": near_valid(
        {"model": st.just(MODEL), "prompt": TEXT | st.lists(st.integers(-5, 300_000), max_size=8)},
        {
            "stream": st.booleans(),
            "stop": st.lists(st.text(min_size=1, max_size=5), max_size=4) | st.text(max_size=3),
            "temperature": st.floats(0, 2),
            "logprobs": st.integers(0, 5),
            "echo": st.booleans(),
            "seed": st.integers(),
            # Valid values: `replace` tries the wrong ones (a suffix is a 400 on a model
            # without fill-in-the-middle tokens), and mostly valid bodies must reach the handler.
            "suffix": st.just(""),
            "n": st.sampled_from([1, 2]),
            "best_of": st.sampled_from([1, 2]),
        },
        fixed={"max_tokens": FEW_TOKENS},
    ),
    "/infill": near_valid(
        {"model": st.just(FIM_MODEL), "input_prefix": TEXT, "input_suffix": TEXT},
        {
            "prompt": TEXT,
            "input_extra": st.lists(
                st.fixed_dictionaries({"filename": WORDS, "text": TEXT}), max_size=2
            ),
            "stream": st.booleans(),
            "stop": st.lists(st.text(min_size=1, max_size=5), max_size=2),
        },
        fixed={"n_predict": FEW_TOKENS},
    ),
    "/v1/tokenize": near_valid(
        {"model": st.just(MODEL), "input": TEXT},
        {
            "apply_template": st.booleans(),
            "add_generation_prompt": st.booleans(),
            "with_pieces": st.booleans(),
        },
    ),
    "/tokenize": near_valid(
        {"model": st.just(MODEL), "content": TEXT},
        {
            "add_special": st.booleans(),
            "parse_special": st.booleans(),
            "with_pieces": st.booleans(),
        },
    ),
    "/detokenize": near_valid({"model": st.just(MODEL), "tokens": TOKEN_IDS}),
    # llama-server's body is a list: the default model has no adapters, so `[]` is served.
    "/lora-adapters": st.lists(
        st.fixed_dictionaries(
            {"id": st.integers(-1, 2), "scale": st.floats(-2, 2) | st.sampled_from(["x", None])}
        ),
        max_size=2,
    ),
    "/v1/detokenize": near_valid({"model": st.just(MODEL), "tokens": TOKEN_IDS}),
    "/v1/responses": near_valid(
        {"model": st.just(MODEL), "input": RESPONSES_INPUT},
        {
            "instructions": TEXT,
            "stream": st.booleans(),
            "temperature": st.floats(0, 2),
            "tools": st.lists(
                st.fixed_dictionaries(
                    {"type": st.just("function"), "name": st.text(max_size=10), "parameters": JSON}
                ),
                max_size=2,
            ),
            "tool_choice": st.sampled_from(["auto", "none", "required"]),
            "text": st.fixed_dictionaries(
                {
                    "format": st.fixed_dictionaries(
                        {"type": st.sampled_from(["text", "json_object"])}
                    )
                    | st.fixed_dictionaries(
                        {"type": st.just("json_schema"), "name": NAME, "schema": HOSTILE_SCHEMA}
                    )
                }
            ),
            "store": st.booleans(),
            "previous_response_id": st.sampled_from(["resp_unknown", ""]),
            "reasoning": st.fixed_dictionaries({"effort": st.sampled_from(["low", "extreme"])}),
        },
        fixed={"max_output_tokens": FEW_TOKENS},
    ),
    "/v1/messages": near_valid(
        {"model": st.just(MODEL), "messages": ANTHROPIC_MESSAGES},
        {
            "system": TEXT,
            "stop_sequences": st.lists(st.text(min_size=1, max_size=5), max_size=3),
            "stream": st.booleans(),
            "temperature": st.floats(0, 1),
            "top_k": st.integers(0, 50),
            "top_p": st.floats(0.01, 1),
            "tools": st.lists(ANTHROPIC_TOOL, max_size=2),
            "tool_choice": st.fixed_dictionaries(
                {"type": st.sampled_from(["auto", "none", "any"])}
            ),
            "thinking": st.fixed_dictionaries({"type": st.just("disabled")}),
        },
        fixed={"max_tokens": FEW_TOKENS},
    ),
    "/v1/messages/count_tokens": near_valid(
        {"model": st.just(MODEL), "messages": ANTHROPIC_MESSAGES},
        {"system": TEXT, "tools": st.lists(ANTHROPIC_TOOL, max_size=2)},
    ),
    "/v1/embeddings": near_valid(
        {
            "model": st.just("minilm"),
            "input": WORDS | st.lists(WORDS, min_size=1, max_size=3),
        },
        {
            "dimensions": st.sampled_from([32, 64, 128, 384]),
            "encoding_format": st.sampled_from(["float", "base64"]),
            "truncate": st.booleans(),
        },
    ),
    **{
        path: near_valid(
            {
                "model": st.just("tiny-reranker"),
                "query": TEXT,
                "documents": st.lists(
                    TEXT | st.fixed_dictionaries({"text": TEXT}), min_size=1, max_size=3
                ),
            },
            {"top_n": st.integers(1, 4), "return_documents": st.booleans()},
        )
        for path in ("/v1/rerank", "/v1/reranking")
    },
    "/v1/kronk/security/tokens": near_valid(
        {
            "duration": st.sampled_from(["1h", "90s", "1h30m"]),
            "endpoints": st.sampled_from(["tokenize", "chat-completions:5/day,rerank"]),
        },
    ),
    "/v1/kronk/security/authenticate": near_valid(
        {"endpoint": st.sampled_from(["chat-completions", "tokenize", "admin"])},
        {"times": st.integers(min_value=0, max_value=3)},
    ),
    "/v1/kronk/security/keys": NO_BODY,
    "/v1/kronk/models/{model_id}/unload": NO_BODY,
    # Pulls run in the background from the fuzz server's local Hub (FUZZ_HUB_FILE).
    "/v1/kronk/pulls": st.one_of(
        near_valid({"model": st.sampled_from(["fuzz-model", "no-such-model"])}),
        near_valid(
            {"url": st.sampled_from(["hub/repo/fuzz.gguf", "hub/repo/missing.gguf", "x.html"])},
            {"proj": st.sampled_from(["hub/repo/fuzz.gguf", "not a url"])},
        ),
    ),
    "/v1/kronk/catalog/update": NO_BODY,
    "/v1/kronk/catalog/templates/update": NO_BODY,
    "/api/chat": near_valid(
        {"model": st.sampled_from([MODEL, MODEL + ":latest"]), "messages": MESSAGES},
        {
            "stream": st.booleans(),
            "tools": st.lists(TOOL, max_size=2),
            "tool_choice": st.sampled_from(["auto", "none", "required"]),
            "format": st.just("json") | SCHEMA,
            "think": st.booleans(),
            "keep_alive": st.sampled_from(["5m", -1, "1h30m", "soon"]),
        },
        fixed={"options": OLLAMA_OPTIONS},
    ),
    "/api/generate": near_valid(
        {"model": st.just(MODEL), "prompt": TEXT},
        {
            "system": TEXT,
            "stream": st.booleans(),
            "raw": st.booleans(),
            "format": st.just("json") | SCHEMA,
            "suffix": TEXT,
            "images": st.lists(st.text(max_size=12), max_size=1),
        },
        fixed={"options": OLLAMA_OPTIONS},
    ),
    "/api/embed": near_valid(
        {"model": st.just("minilm"), "input": WORDS | st.lists(WORDS, min_size=1, max_size=3)},
        {"truncate": st.booleans(), "dimensions": st.sampled_from([32, 384, 385])},
    ),
    "/api/embeddings": near_valid({"model": st.just("minilm"), "prompt": WORDS}),
    "/api/show": near_valid({"model": st.sampled_from([MODEL, "minilm:latest", "no-such"])}),
    # Names only, never a reference: a Hugging Face one would be fetched (a 502 without a
    # network is the pull's honest answer, not the fuzz's business).
    "/api/pull": near_valid(
        {"model": st.sampled_from([MODEL, "no-such"])},
        {"stream": st.booleans(), "insecure": st.booleans()},
    ),
}
# Multipart routes: the form's fields (a value that is not text is sent as its JSON) and its
# file, a sound mostly.
AUDIO_MODEL = "audio"
FILES = st.sampled_from([wav(440, seconds=0.3), wav(440, seconds=0.3)]) | st.binary(max_size=64)
SPEECH_FIELDS = {
    "prompt": TEXT,
    "response_format": st.sampled_from(["json", "text", "srt", "verbose_json", "vtt"]),
    "temperature": st.floats(0, 1),
}


@st.composite
def forms(draw: st.DrawFn, fields: st.SearchStrategy[dict[str, Any]]) -> FormBody:
    return FormBody(draw(fields), draw(FILES | st.none()))


KNOWN_FORMS: dict[str, st.SearchStrategy[FormBody]] = {
    "/v1/audio/transcriptions": forms(
        near_valid(
            {"model": st.just(AUDIO_MODEL)},
            {
                **SPEECH_FIELDS,
                "language": st.sampled_from(["en", "de"]),
                "stream": st.sampled_from(["true", "false"]),
                "include[]": st.just("logprobs"),
                "timestamp_granularities[]": st.sampled_from(["segment", "word"]),
            },
        )
    ),
    "/v1/audio/translations": forms(near_valid({"model": st.just(AUDIO_MODEL)}, SPEECH_FIELDS)),
}
# The fuzz server's catalog source and Hub: a local file server, never the internet.
FUZZ_HUB_FILE = "/hub/repo/resolve/main/fuzz.gguf"
FUZZ_CATALOG = """\
catalog: fuzz
models:
  - id: fuzz-model
    category: Reranking
    files:
      models:
        - url: hub/repo/fuzz.gguf
"""
GENERIC_BODY = st.one_of(
    JSON,
    st.dictionaries(st.sampled_from(["model", "messages", "input", "max_tokens"]), JSON),
)
# A path parameter: a model that exists (the reranker reloads on its next use) or one that does not.
PATH_VALUES = st.sampled_from(["tiny-reranker", "no-such-model", "%2e%2e"])
# The first body a route serves, unshrunk (each try is a request).
FIND_ONE = settings(database=None, derandomize=True, max_examples=60, phases=[Phase.generate])


def bodies(path: str) -> st.SearchStrategy[bytes]:
    """Near-valid bodies mostly, sometimes any JSON or raw bytes."""
    if path in KNOWN_FORMS:
        near = KNOWN_FORMS[path].map(FormBody.encoded)
        return st.one_of(near, near, near, st.binary(max_size=100))
    near = KNOWN_BODIES[path].map(lambda body: json.dumps(body).encode())
    return st.one_of(
        near,
        near,
        near,
        GENERIC_BODY.map(lambda body: json.dumps(body).encode()),
        st.binary(max_size=100),
    )


HEADER_TEXT = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=60
)


@dataclass(frozen=True)
class Sender:
    """Who a fuzzed request says it is: a description that the fuzz server's tokens turn into
    headers when the request is sent, so that a falsifying example, as Hypothesis prints it,
    can be written into FOUND and replayed by later runs (the tokens are new every run).

    `text` is the header's text for the raw kinds and the replacement character for
    "altered" (the user's token with one character of its claims changed at `position`).
    """

    kind: Literal[
        "user", "user-key", "admin", "none", "forged-admin", "altered", "basic", "raw",
        "raw-bearer", "raw-key",
    ]  # fmt: skip
    text: str = ""
    position: int = 0

    @property
    def who(self) -> Literal["user", "admin", "nobody"]:
        """Whom the server must take the request for."""
        if self.kind in ("user", "user-key"):
            return "user"
        return "admin" if self.kind == "admin" else "nobody"

    def headers(self, server: FuzzServer) -> dict[str, str]:
        match self.kind:
            case "user":
                return {"Authorization": f"Bearer {server.user}"}
            case "user-key":
                return {"x-api-key": server.user}
            case "admin":
                return {"Authorization": f"Bearer {server.admin}"}
            case "none":
                return {}
            case "forged-admin":
                return {"Authorization": f"Bearer {server.forged_admin}"}
            case "altered":
                altered = _altered(server.user, self.position, self.text)
                return {"Authorization": f"Bearer {altered}"}
            case "basic":
                return {"Authorization": f"Basic {server.user}"}
            case "raw":
                return {"Authorization": self.text}
            case "raw-bearer":
                return {"Authorization": f"Bearer {self.text}"}
            case "raw-key":
                return {"x-api-key": self.text}


def _altered(token: str, position: int, replacement: str) -> str:
    """The token with one character of its claims changed: the signature no longer matches."""
    header, claims, signature = token.split(".")
    index = position % (len(claims) - 1)  # not the last: its low bits may not count
    if claims[index] == replacement:
        replacement = "A" if replacement != "A" else "B"
    return f"{header}.{claims[:index]}{replacement}{claims[index + 1 :]}.{signature}"


ADMIN = Sender("admin")
VALID_SENDER = st.sampled_from([Sender("user"), Sender("user-key"), ADMIN])
REFUSED_SENDER = st.one_of(
    st.sampled_from([Sender("none"), Sender("forged-admin"), Sender("basic")]),
    st.builds(
        lambda position, char: Sender("altered", char, position),
        st.integers(0, 10_000),
        st.sampled_from("ABCxyz019-_"),
    ),
    st.builds(Sender, st.sampled_from(["raw", "raw-bearer", "raw-key"]), HEADER_TEXT),
)
SENDERS = st.one_of(VALID_SENDER, VALID_SENDER, REFUSED_SENDER)


def _unsigned_jwt(header: dict[str, Any]) -> str:
    parts = (json.dumps(header), json.dumps({"sub": "x"}), "sig")
    return ".".join(base64.urlsafe_b64encode(part.encode()).rstrip(b"=").decode() for part in parts)


# The corpus beyond the derandomized examples: requests that a fuzz run (`nox -s fuzz`) or a
# probe found wanting, as (model_id, body, sender), replayed on every run of the route's
# fuzz. A falsifying example goes in as Hypothesis printed it (docs/install.md, "Fuzzing").
SURROGATE = chat_body(messages=[{"role": "user", "content": "\ud800"}], max_tokens=1)
TOKENIZE = {"model": MODEL, "input": "hi"}
FOUND: dict[str, list[tuple[str, bytes, Sender]]] = {
    # A lone surrogate was a 500 from the tokenizer (issue 24's probe).
    CHAT: [("", json.dumps(SURROGATE).encode(), Sender("user"))],
    # A token whose header's kid is not a string, or that carries crit, was a 500 (the same).
    "/v1/tokenize": [
        ("", json.dumps(TOKENIZE).encode(), Sender("raw-bearer", _unsigned_jwt(header)))
        for header in (
            {"alg": "RS256", "kid": 1},
            {"alg": "RS256", "kid": None},
            {"alg": "RS256", "kid": ["a"]},
            {"alg": "RS256", "kid": "a", "crit": ["exp"]},
        )
    ],
}


@dataclass
class FuzzServer:
    base_url: str
    app: Litestar
    user: str
    admin: str
    forged_admin: str


@pytest.fixture(scope="module")
def fuzz_server(
    tmp_path_factory: pytest.TempPathFactory,
    serve: Serve,
    gemma_path: str,
    minilm_path: Path,
    reranker_path: Path,
    tiny_fim_path: Path,
    multimodal_paths: MultimodalPaths,
) -> Iterator[FuzzServer]:
    """Auth on; a small default model, an embedding model, a reranker, a model with
    fill-in-the-middle tokens and one that reads sound."""
    base = tmp_path_factory.mktemp("fuzz-home")
    models = {
        MODEL: ModelConfig(model_path=gemma_path, template="gemma", context_window=512),
        "minilm": ModelConfig(model_path=minilm_path, matryoshka=True),
        "tiny-reranker": ModelConfig(model_path=reranker_path),
        FIM_MODEL: ModelConfig(model_path=tiny_fim_path, context_window=512, n_seq_max=1),
        AUDIO_MODEL: ModelConfig.model_validate(
            {
                "model_path": multimodal_paths.model,
                "projector_path": multimodal_paths.audio,
                "templates": {"template": "gemma"},
                "context_window": 1024,
                "n_seq_max": 1,
            }
        ),
    }
    kronk = Kronk(KronkConfig(base_path=base, models=models, models_in_cache=5))
    hub = FileServer()
    hub.routes[FUZZ_HUB_FILE] = Served(path=reranker_path)
    hub.routes["/catalogs/fuzz.yaml"] = Served(data=FUZZ_CATALOG.encode())
    catalog = {
        "hf_endpoint": hub.url,
        "source": f"{hub.url}/catalogs/fuzz.yaml",
        "templates_source": "",
    }
    sections = {"auth-jwt": {"enabled": True}, "catalog": catalog}
    app = create_app(ServerSettings(base_path=base, sections=sections), kronk=kronk)
    with hub, serve(app) as base_url:
        keys = base / "keys"
        admin = (keys / "master.jwt").read_text()
        grants = (
            "chat-completions,completions,responses,messages,embeddings,rerank,tokenize,"
            "ollama-chat,ollama-generate,ollama-embed,transcriptions"
        )
        minted = httpx.post(
            f"{base_url}/v1/kronk/security/tokens",
            json={"duration": "1h", "endpoints": grants},
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert minted.status_code == 201, minted.text
        user = minted.json()["token"]
        signing = next(path for path in sorted(keys.glob("*.pem")) if path.stem != "master")
        key = serialization.load_pem_private_key(signing.read_bytes(), password=None)
        claims = jwt.decode(user, options={"verify_signature": False})
        forged_admin = jwt.encode(
            {**claims, "admin": True},
            key,
            algorithm="RS256",
            headers={"kid": signing.stem},  # type: ignore[arg-type]
        )
        yield FuzzServer(base_url, app, user, admin, forged_admin)


def content_type(route: str) -> str:
    return FORM_TYPE if route in KNOWN_FORMS else "application/json"


def test_the_fuzz_knows_every_post_route(fuzz_server: FuzzServer) -> None:
    """Routes come from the app, so a POST route that a plugin adds must be given bodies here."""
    assert set(post_paths(fuzz_server.app)) == set(KNOWN_BODIES) | set(KNOWN_FORMS)


@pytest.mark.fuzz
@pytest.mark.parametrize("route", sorted([*KNOWN_BODIES, *KNOWN_FORMS]))
def test_fuzzed_requests_never_get_a_5xx_and_auth_always_holds(
    fuzz_server: FuzzServer, route: str, explore: Callable[[Callable[[], None]], None]
) -> None:
    """Near-valid bodies with valid and broken credentials: the corpus (FOUND and examples
    derived from this code, so a failure comes back on the next run), or random ones under
    `nox -s fuzz`."""
    with httpx.Client(base_url=fuzz_server.base_url, timeout=60) as client:

        @fuzz_settings(
            f"post {route}",
            max_examples=60,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(model_id=PATH_VALUES, body=bodies(route), sent=SENDERS)
        def post(model_id: str, body: bytes, sent: Sender) -> None:
            path = route.replace("{model_id}", model_id)
            headers = {"content-type": content_type(route), **sent.headers(fuzz_server)}
            response = client.post(path, content=body, headers=headers)
            where = (path, sent, body, response.text)
            assert response.status_code < 500, where
            assert "Traceback" not in response.text, where
            if sent.who == "nobody":
                assert response.status_code == 401, where
            else:
                assert response.status_code != 401, where
            if sent.who == "admin":
                assert response.status_code != 403, where

        for model_id, body, sent in FOUND.get(route, []):
            post = example(model_id=model_id, body=body, sent=sent)(post)
        explore(post)
        if not route.startswith("/v1/kronk/"):
            # The near-valid bodies reach the handler: one of them, from the admin, is served.
            # (Found apart from the run above: which examples Hypothesis derives there depends
            # on what the process has imported, so the admin may never send a valid body.)
            def served(body: Any) -> bool:
                headers = {"content-type": content_type(route), **ADMIN.headers(fuzz_server)}
                sent = body.encoded() if isinstance(body, FormBody) else json.dumps(body).encode()
                response = client.post(route, content=sent, headers=headers)
                assert response.status_code < 500, (body, response.text)
                return 200 <= response.status_code < 300

            find(KNOWN_FORMS.get(route) or KNOWN_BODIES[route], served, settings=FIND_ONE)
        assert client.get("/v1/liveness").status_code == 200
        after = client.post(
            CHAT,
            json=chat_body(max_tokens=2, temperature=0),
            headers={"Authorization": f"Bearer {fuzz_server.user}"},
        )
        assert after.status_code == 200, after.text


def _tools(schema: Any) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "f", "parameters": schema}}]


# (route, the fields that carry a hostile output constraint in a body that is otherwise valid)
HOSTILE_OUTPUT = st.one_of(
    HOSTILE_GRAMMAR.map(lambda gbnf: (CHAT, {"grammar": gbnf})),
    HOSTILE_SCHEMA.map(lambda schema: (CHAT, {"json_schema": schema})),
    HOSTILE_SCHEMA.map(
        lambda schema: (
            CHAT,
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": schema},
                }
            },
        )
    ),
    HOSTILE_SCHEMA.map(lambda schema: (CHAT, {"tools": _tools(schema), "tool_choice": "required"})),
    HOSTILE_SCHEMA.map(
        lambda schema: (
            "/v1/messages",
            {
                "tools": [{"name": "f", "input_schema": schema}],
                "tool_choice": {"type": "any"},
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
    ),
    HOSTILE_SCHEMA.map(
        lambda schema: (
            "/v1/responses",
            {
                "input": "hi",
                "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}},
            },
        )
    ),
)


def test_fuzzed_output_constraints_are_refused(fuzz_server: FuzzServer) -> None:
    """Every shape past the structured-output limits, on every route that takes one: a 400
    that says why, and the model serves the next request."""
    headers = {"Authorization": f"Bearer {fuzz_server.user}"}
    with httpx.Client(base_url=fuzz_server.base_url, timeout=60, headers=headers) as client:

        @settings(max_examples=80, deadline=None, database=None, derandomize=True)
        @given(case=HOSTILE_OUTPUT)
        def post(case: tuple[str, dict[str, Any]]) -> None:
            route, fields = case
            body = {"model": MODEL, "max_tokens": 2, **fields}
            if route == CHAT:
                body["messages"] = [{"role": "user", "content": "hi"}]
            response = client.post(route, json=body)
            assert response.status_code == 400, (route, fields, response.text)
            assert "Traceback" not in response.text

        post()
        after = client.post(CHAT, json=chat_body(max_tokens=2, temperature=0))
        assert after.status_code == 200, after.text
