"""Hardening of every server, auth on or off: body limits, CORS, bind, logs, error bodies, fuzz."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from litestar import Litestar
from litestar.routes import HTTPRoute

from kronk_api import ServerSettings, create_app
from kronk_core import DEFAULT_MODEL_ID, Kronk, KronkConfig, ModelConfig

if TYPE_CHECKING:
    from conftest import RunningServer, Serve

MODEL = DEFAULT_MODEL_ID
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
    # Past every body limit; this text-only model then refuses the image part itself.
    assert_openai_error(response, 400, "text")


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


# ---- fuzz: every POST endpoint of the app ------------------------------------------------


def post_paths(app: Litestar) -> list[str]:
    """Every POST route the app has, path parameters filled in, whichever plugin added it."""
    paths = set()
    for route in app.routes:
        if isinstance(route, HTTPRoute) and "POST" in route.methods:
            paths.add(route.path_format.replace("{", "").replace("}", ""))
    return sorted(paths)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


def sometimes_wrong(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly `valid`, one time in four any JSON value."""
    return st.integers(0, 3).flatmap(lambda pick: JSON if pick == 0 else valid)


def mutated(
    required: dict[str, st.SearchStrategy[Any]],
    optional: dict[str, st.SearchStrategy[Any]],
    fixed: dict[str, st.SearchStrategy[Any]] | None = None,
) -> st.SearchStrategy[dict[str, Any]]:
    """A valid body whose fields are sometimes wrong, plus some optional fields."""
    mapping = {key: sometimes_wrong(strategy) for key, strategy in required.items()}
    return st.fixed_dictionaries(
        {**mapping, **(fixed or {})},
        optional={key: sometimes_wrong(strategy) for key, strategy in optional.items()},
    )


MESSAGES = st.lists(
    st.fixed_dictionaries(
        {
            "role": sometimes_wrong(st.sampled_from(["user", "system", "assistant"])),
            "content": sometimes_wrong(st.text(max_size=40)),
        }
    ),
    min_size=1,
    max_size=3,
)
TOOL = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": st.text(max_size=10), "parameters": JSON}),
    }
)
# Bodies that reach past the schemas of the endpoints known today. max_tokens stays small,
# so a body that happens to be valid generates a token or two, not thousands.
KNOWN_BODIES = {
    CHAT: mutated(
        {"model": st.just(MODEL), "messages": MESSAGES},
        {
            "stream": st.booleans(),
            "stop": st.lists(st.text(max_size=5), max_size=5),
            "temperature": st.floats(0, 2),
            "top_k": st.integers(0, 50),
            "logprobs": st.booleans(),
            "top_logprobs": st.integers(0, 6),
            "seed": st.integers(),
            "tools": st.lists(TOOL, max_size=2),
            "tool_choice": st.sampled_from(["auto", "none", "required"]),
            "response_format": st.fixed_dictionaries(
                {"type": st.sampled_from(["text", "json_object", "json_schema"])}
            ),
            "json_schema": st.just({"type": "object"}),
            "grammar": st.sampled_from(['root ::= "a"', "root ::= (", ""]),
        },
        # Never null or absent: a valid body must not generate thousands of tokens.
        fixed={"max_tokens": st.integers(-1, 3) | st.sampled_from(["2", "x", 1.5, [], {}])},
    ),
    "/v1/tokenize": mutated(
        {"model": st.just(MODEL), "input": st.text(max_size=40)},
        {"apply_template": st.booleans(), "add_generation_prompt": st.booleans()},
    ),
}
GENERIC_BODY = st.one_of(
    JSON,
    st.dictionaries(st.sampled_from(["model", "messages", "input", "max_tokens"]), JSON),
)


def bodies(path: str) -> st.SearchStrategy[bytes]:
    """Raw bytes, any JSON, and for known endpoints near-valid bodies."""
    near_valid = KNOWN_BODIES.get(path, GENERIC_BODY)
    return st.one_of(
        near_valid.map(lambda body: json.dumps(body).encode()),
        GENERIC_BODY.map(lambda body: json.dumps(body).encode()),
        st.binary(max_size=100),
    )


def test_fuzzed_bodies_never_get_a_5xx(server: RunningServer) -> None:
    paths = post_paths(server.app)
    assert {CHAT, "/v1/tokenize"} <= set(paths)

    with httpx.Client(base_url=server.base_url, timeout=30) as client:

        @settings(
            max_examples=60 * len(paths),
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(data=st.data())
        def post(data: st.DataObject) -> None:
            path = data.draw(st.sampled_from(paths))
            body = data.draw(bodies(path))
            response = client.post(path, content=body, headers={"content-type": "application/json"})
            assert response.status_code < 500, (path, body, response.text)
            assert "Traceback" not in response.text

        post()
        assert client.get("/v1/liveness").status_code == 200
        after = client.post(CHAT, json=chat_body(max_tokens=2, temperature=0))
        assert after.status_code == 200, after.text
