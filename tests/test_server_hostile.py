"""Hostile requests against a real server: each is refused with a clear 4xx or served, while the
server's memory and another client's short chat stay within bounds.

The server runs in this process (uvicorn in a thread), so its memory is this process's RSS,
sampled while the hostile request is in flight. The bounds are far from what was seen before
the limits existed: a `minItems` of 1e9 grew the server 0.7 GB a second until the kernel
killed it, and a 20,000-value enum held a 4-token chat on the same model for 41.7 s.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_core.contract.errors import InvalidRequestError
from kronk_llamacpp.packaged import DEFAULT_MODEL_ID, DEFAULT_MODEL_SETTINGS

if TYPE_CHECKING:
    from kronk_testing.server import RunningServer, Serve

MODEL = DEFAULT_MODEL_ID
CHAT = "/v1/chat/completions"
LIMITS = f"models.{MODEL}.llamacpp.structured_output"
# Growth of the server's resident memory while a hostile request is in flight.
MAX_GROWTH_BYTES = 512 << 20
# How many times its own time alone a bystander's 4-token chat may take while a hostile
# request is in flight. Its time alone is measured in the same test, just before and just
# after (the slower of the two medians), so a machine's speed and load cancel out. Measured
# on 2 loaded cores: at most 7 times (the 5 MB logit_bias body, parsed on the event loop),
# mostly 1 to 3; a request that held the model did far worse (the enum of 20,000 values:
# 41.7 s, some 150 times a bystander's time alone).
BYSTANDER_FACTOR = 20
# Bystanders timed alone, before the hostile request and after it.
ALONE_RUNS = 3


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


@dataclass
class MemoryWatch:
    """The highest RSS seen, sampled every few milliseconds in a thread of its own."""

    start: int = field(default_factory=_rss)
    peak: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    @property
    def growth(self) -> int:
        return max(0, self.peak - self.start)


@contextmanager
def watched_memory() -> Iterator[MemoryWatch]:
    watch = MemoryWatch()
    thread = threading.Thread(target=watch.run, daemon=True)
    thread.start()
    try:
        yield watch
    finally:
        watch._stop.set()
        thread.join()


def chat(**fields: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "temperature": 0,
        **fields,
    }


@dataclass
class Outcome:
    response: httpx.Response
    growth: int
    bystanders: list[float]
    # RSS after the request (and the bystanders after it) less RSS before it.
    retained: int
    # A bystander's time with nothing else in flight (see BYSTANDER_FACTOR).
    alone: float


async def _bystander(client: httpx.AsyncClient) -> float:
    loop = asyncio.get_running_loop()
    started = loop.time()
    response = await client.post(CHAT, json=chat(messages=[{"role": "user", "content": "Hello"}]))
    assert response.status_code == 200, response.text
    return loop.time() - started


async def hostile(base_url: str, path: str, body: bytes) -> Outcome:
    """Send `body` while another client chats on the same model, back to back, until the
    hostile request is answered; the memory the server grew meanwhile is measured, and the
    bystander is timed alone before and after."""
    timeout = httpx.Timeout(300, connect=10)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout) as client:
        await _bystander(client)  # the model is loaded and warm before anything is measured
        before = [await _bystander(client) for _ in range(ALONE_RUNS)]
        with watched_memory() as watch:
            request = asyncio.create_task(
                client.post(path, content=body, headers={"content-type": "application/json"})
            )
            bystanders = [await _bystander(client)]
            while not request.done():
                bystanders.append(await _bystander(client))
            response = await request
        after = [await _bystander(client) for _ in range(ALONE_RUNS)]
    alone = max(statistics.median(before), statistics.median(after))
    return Outcome(response, watch.growth, bystanders, _rss() - watch.start, alone)


def assert_harmless(outcome: Outcome) -> None:
    assert "Traceback" not in outcome.response.text
    assert outcome.growth < MAX_GROWTH_BYTES, f"the server grew {outcome.growth >> 20} MiB"
    slowest = max(outcome.bystanders)
    assert slowest < BYSTANDER_FACTOR * outcome.alone, (
        f"a 4-token chat took {slowest:.2f}s meanwhile, {outcome.alone:.2f}s alone"
    )


def assert_refused(outcome: Outcome, status: int, *words: str) -> None:
    assert_harmless(outcome)
    assert outcome.response.status_code == status, outcome.response.text
    message = outcome.response.json()["error"]["message"]
    for word in words:
        assert word in message, message


def _schema(schema: Any) -> dict[str, Any]:
    return chat(
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    )


def _nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _grammar_chain(rules: int) -> str:
    lines = [f"r{index} ::= r{index + 1}" for index in range(rules)]
    return "\n".join(["root ::= r0", *lines, f'r{rules} ::= "a"'])


def _grammar_doubling(levels: int) -> str:
    lines = [f"r{index} ::= r{index - 1} r{index - 1}" for index in range(1, levels)]
    return "\n".join([f'root ::= r{levels - 1} "y"', 'r0 ::= "x"?', *lines])


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{index}",
            "description": "Looks something up.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    for index in range(1000)
]

CONVERSATION = [{"role": "user", "content": "a question"}, {"role": "assistant", "content": "ok"}]
# (body, status, words the message holds): each is refused, the limit's key named.
REFUSED: dict[str, tuple[dict[str, Any], int, tuple[str, ...]]] = {
    "min_items_1e9": (
        _schema({"type": "array", "items": {"type": "integer"}, "minItems": 10**9}),
        400,
        ("minItems is 1000000000", f"{LIMITS}.max_repetition"),
    ),
    "max_items_1e9": (
        _schema({"type": "array", "items": {"type": "integer"}, "maxItems": 10**9}),
        400,
        ("maxItems is 1000000000", f"{LIMITS}.max_repetition"),
    ),
    "min_length_1e9": (
        chat(json_schema={"type": "string", "minLength": 10**9}),
        400,
        ("minLength", f"{LIMITS}.max_repetition"),
    ),
    "pattern_repeated_1e9": (
        chat(json_schema={"type": "string", "pattern": "^a{1000000000}$"}),
        400,
        ("1000000000 times", f"{LIMITS}.max_repetition"),
    ),
    "enum_of_20000": (
        _schema({"enum": [f"value number {index}" for index in range(20_000)]}),
        400,
        ("20000 values", f"{LIMITS}.max_enum_values"),
    ),
    "any_of_20000": (
        _schema({"anyOf": [{"const": index} for index in range(20_000)]}),
        400,
        ("20000 alternatives", f"{LIMITS}.max_alternatives"),
    ),
    "properties_50000": (
        chat(json_schema={"type": "object", "properties": {f"p{i}": {} for i in range(50_000)}}),
        400,
        ("50000 properties", f"{LIMITS}.max_properties"),
    ),
    "schema_nested_20_objects_deep": (
        _schema(_nested(20)),
        400,
        (f"{LIMITS}.max_schema_depth",),
    ),
    "grammar_parentheses_30000_deep": (
        chat(grammar="root ::= " + "(" * 30_000 + '"a"' + ")" * 30_000),
        400,
        (f"{LIMITS}.max_grammar_depth",),
    ),
    "grammar_chain_of_20000_rules": (
        chat(grammar=_grammar_chain(20_000)),
        400,
        (f"{LIMITS}.max_grammar_depth",),
    ),
    "grammar_doubling_24_times": (
        chat(grammar=_grammar_doubling(24)),
        400,
        (f"{LIMITS}.max_grammar_branches",),
    ),
    "grammar_of_a_megabyte": (
        chat(grammar='root ::= "' + "a" * (1 << 20) + '"'),
        400,
        (f"{LIMITS}.max_grammar_bytes",),
    ),
    "tools_1000_forced": (
        chat(tools=TOOLS, tool_choice="required"),
        400,
        ("context window",),
    ),
    "tools_1000": (chat(tools=TOOLS), 400, ("context window",)),
    "messages_10000": (
        chat(messages=[*CONVERSATION * 5000, {"role": "user", "content": "last"}]),
        400,
        ("context window",),
    ),
    "content_parts_10000": (
        chat(
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "text", "text": f"p{i} "} for i in range(10_000)],
                }
            ]
        ),
        400,
        ("context window",),
    ),
    "logit_bias_over_the_vocabulary": (
        chat(logit_bias={str(token): -1 for token in range(262_144)}),
        400,
        ("more than 100000 items",),
    ),
}


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
async def test_hostile_request_is_refused_and_harms_no_one(
    server: RunningServer, case: str
) -> None:
    body, status, words = REFUSED[case]
    outcome = await hostile(server.base_url, CHAT, json.dumps(body).encode())
    assert_refused(outcome, status, *words)


# The schema refusals again, each keyword below the root: a check that read only the root
# passes none of them. (keyword's schema, words the message holds.) Counts are one past the
# default limits, so that a tool's parameters still fit the context when they are rendered
# into the prompt. The pattern's quantifier is refused by the converter's repetition
# builder, which sees every level by construction.
NESTED_LIMITS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "min_items_1e9": (
        {"type": "array", "items": {"type": "integer"}, "minItems": 10**9},
        ("minItems is 1000000000", f"{LIMITS}.max_repetition"),
    ),
    "max_items_1e9": (
        {"type": "array", "items": {"type": "integer"}, "maxItems": 10**9},
        ("maxItems is 1000000000", f"{LIMITS}.max_repetition"),
    ),
    "min_length_1e9": (
        {"type": "string", "minLength": 10**9},
        ("minLength is 1000000000", f"{LIMITS}.max_repetition"),
    ),
    "pattern_repeated_1e9": (
        {"type": "string", "pattern": "^a{1000000000}$"},
        ("1000000000 times", f"{LIMITS}.max_repetition"),
    ),
    "enum_of_1001": (
        {"enum": list(range(1001))},
        ("1001 values", f"{LIMITS}.max_enum_values"),
    ),
    "any_of_129": (
        {"anyOf": [{"const": index} for index in range(129)]},
        ("129 alternatives", f"{LIMITS}.max_alternatives"),
    ),
    "properties_1001": (
        {"type": "object", "properties": {f"p{i}": {} for i in range(1001)}},
        ("1001 properties", f"{LIMITS}.max_properties"),
    ),
}


def _object_with(inner: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": inner}, "required": ["a"]}


# Where a keyword can sit below the root: a request body holding `inner` there.
NESTINGS: dict[str, Any] = {
    "in_properties": lambda inner: _schema(_object_with(inner)),
    "in_items": lambda inner: _schema({"type": "array", "items": inner, "minItems": 1}),
    "in_defs_through_ref": lambda inner: _schema(
        {**_object_with({"$ref": "#/$defs/inner"}), "$defs": {"inner": inner}}
    ),
    "in_any_of": lambda inner: _schema({"anyOf": [{"type": "null"}, inner]}),
    "in_tool_parameters": lambda inner: chat(
        tools=[{"type": "function", "function": {"name": "f", "parameters": _object_with(inner)}}],
        tool_choice="required",
    ),
}


@pytest.mark.parametrize("nesting", list(NESTINGS))
@pytest.mark.parametrize("limit", list(NESTED_LIMITS))
async def test_a_hostile_keyword_below_the_root_is_refused(
    server: RunningServer, limit: str, nesting: str
) -> None:
    inner, words = NESTED_LIMITS[limit]
    body = NESTINGS[nesting](inner)
    outcome = await hostile(server.base_url, CHAT, json.dumps(body).encode())
    assert_refused(outcome, 400, *words)


# Every spelling of a billion repetitions that llama-cpp-python's pattern parser reads
# (it splits on "," and calls int(), which takes signs, spaces and underscores).
QUANTIFIERS = ["{1000000000}", "{,1000000000}", "{ ,1000000000}", "{+1000000000}",
               "{1_000_000_000}", "{2,1000000000}"]


def _tool_schema(pattern: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"q": {"type": "string", "pattern": pattern}},
        "required": ["q"],
    }


# Each way a request constrains its output with a JSON schema: (path, body for a pattern).
SCHEMA_ENTRY_POINTS: dict[str, tuple[str, Any]] = {
    "openai_response_format": (CHAT, lambda p: _schema({"type": "string", "pattern": p})),
    "openai_forced_tool": (
        CHAT,
        lambda p: chat(
            tools=[{"type": "function", "function": {"name": "f", "parameters": _tool_schema(p)}}],
            tool_choice="required",
        ),
    ),
    "anthropic_forced_tool": (
        "/v1/messages",
        lambda p: {
            "model": MODEL,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": _tool_schema(p)}],
            "tool_choice": {"type": "tool", "name": "f"},
        },
    ),
    "ollama_format": (
        "/api/chat",
        lambda p: {
            "model": MODEL,
            "stream": False,
            "messages": [{"role": "user", "content": "hi"}],
            "format": {"type": "string", "pattern": p},
            "options": {"num_predict": 4},
        },
    ),
    "responses_text_format": (
        "/v1/responses",
        lambda p: {
            "model": MODEL,
            "input": "hi",
            "max_output_tokens": 4,
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "x",
                    "schema": {"type": "string", "pattern": p},
                }
            },
        },
    ),
}
# What the server may still hold after a refusal, against its size before the request.
MAX_RETAINED_BYTES = 64 << 20


@pytest.mark.parametrize("entry", list(SCHEMA_ENTRY_POINTS))
@pytest.mark.parametrize("quantifier", QUANTIFIERS)
async def test_a_pattern_repeated_a_billion_times_is_refused_in_every_spelling_and_dialect(
    server: RunningServer, entry: str, quantifier: str
) -> None:
    """The converter's own parser reads the counts, and its repetition builder refuses them
    before writing anything out; memory goes back to where it was."""
    path, body = SCHEMA_ENTRY_POINTS[entry]
    outcome = await hostile(server.base_url, path, json.dumps(body(f"^a{quantifier}$")).encode())
    assert_harmless(outcome)
    assert outcome.response.status_code == 400, outcome.response.text
    assert f"{LIMITS}.max_repetition" in outcome.response.text
    assert "1000000000 times" in outcome.response.text
    assert outcome.retained < MAX_RETAINED_BYTES, f"kept {outcome.retained >> 20} MiB"


async def test_a_logit_bias_over_most_of_the_vocabulary_is_served(server: RunningServer) -> None:
    body = chat(logit_bias={str(token): -1 for token in range(40_000)}, max_tokens=8)
    outcome = await hostile(server.base_url, CHAT, json.dumps(body).encode())
    assert_harmless(outcome)
    assert outcome.response.status_code == 200, outcome.response.text


async def test_a_schema_at_the_limits_is_served(server: RunningServer) -> None:
    """Everything at its default limit at once: served, and nobody else waits for it."""
    item = {"type": "string", "maxLength": 1000}
    schema = {
        "type": "object",
        "properties": {
            "choice": {"enum": [f"value number {index}" for index in range(1000)]},
            "kind": {"anyOf": [{"const": f"kind {index}"} for index in range(128)]},
            "items": {"type": "array", "items": item, "minItems": 1, "maxItems": 1000},
        },
        "required": ["choice", "kind", "items"],
    }
    outcome = await hostile(
        server.base_url, CHAT, json.dumps(_schema(schema) | {"max_tokens": 48}).encode()
    )
    assert_harmless(outcome)
    assert outcome.response.status_code == 200, outcome.response.text


@pytest.fixture(scope="module")
def wide_server(tmp_path_factory: pytest.TempPathFactory, serve: Serve) -> Iterator[str]:
    """The default model with its enum and schema-size limits raised."""
    settings = {
        **DEFAULT_MODEL_SETTINGS,
        "cache": "none",
        "draft_strategy": "none",
        "context_window": 1024,
        "llamacpp": {"structured_output": {"max_enum_values": 50_000, "max_schema_bytes": 1 << 20}},
    }
    base = tmp_path_factory.mktemp("wide-home")
    kronk = Kronk(KronkConfig(base_path=base, models={MODEL: ModelConfig.model_validate(settings)}))
    with serve(create_app(ServerSettings(base_path=base), kronk=kronk)) as base_url:
        yield base_url


@pytest.mark.model
async def test_an_enum_of_20000_values_is_served_once_allowed(wide_server: str) -> None:
    """The enum that held the model for tens of seconds: a tree of shared prefixes now, each
    token checked against a handful of branches, compiled off the engine thread."""
    values = [f"value number {index}" for index in range(20_000)]
    body = _schema({"enum": values}) | {"max_tokens": 32}
    outcome = await hostile(wide_server, CHAT, json.dumps(body).encode())
    assert_harmless(outcome)
    assert outcome.response.status_code == 200, outcome.response.text
    answer = outcome.response.json()["choices"][0]["message"]["content"]
    assert json.loads(answer) in values


# ---- strings that are not Unicode ----------------------------------------------------

# Where the JSON text gets an escape of half a surrogate pair (json.dumps writes none).
HALF = "HALF-A-PAIR"
SURROGATE_BODIES: dict[str, dict[str, Any]] = {
    CHAT: {"model": MODEL, "messages": [{"role": "user", "content": HALF}]},
    "/v1/completions": {"model": MODEL, "prompt": HALF, "max_tokens": 2},
    "/v1/tokenize": {"model": MODEL, "input": HALF},
    "/v1/messages": {
        "model": MODEL,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": HALF}],
    },
    "/v1/messages/count_tokens": {"model": MODEL, "messages": [{"role": "user", "content": HALF}]},
    "/v1/responses": {"model": MODEL, "input": HALF, "max_output_tokens": 2},
    "/v1/embeddings": {"model": "minilm", "input": HALF},
    "/v1/rerank": {"model": "tiny-reranker", "query": HALF, "documents": ["x"]},
}


@pytest.mark.parametrize("path", list(SURROGATE_BODIES))
@pytest.mark.parametrize("where", ["value", "key"])
def test_a_lone_surrogate_is_400_on_every_route(
    server: RunningServer, path: str, where: str
) -> None:
    text = json.dumps(SURROGATE_BODIES[path])
    if where == "key":  # the values are fine; an unknown field's name is not Unicode
        text = text.replace(HALF, "fine")[:-1] + f', "{HALF}": 1}}'
    text = text.replace(HALF, "a\\ud800b")
    response = httpx.post(
        server.base_url + path,
        content=text.encode(),
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    assert "Traceback" not in response.text
    assert "not valid Unicode" in response.text, response.text


async def test_the_sdk_refuses_a_lone_surrogate(server: RunningServer) -> None:
    with pytest.raises(InvalidRequestError, match="not valid Unicode"):
        await server.kronk.chat([{"role": "user", "content": "a\ud800b"}], max_tokens=2)
    with pytest.raises(InvalidRequestError, match="not valid Unicode"):
        await server.kronk.chat(
            [{"role": "user", "content": "hi"}], max_tokens=2, grammar='root ::= "\ud800"'
        )
