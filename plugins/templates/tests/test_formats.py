"""Tool-call and reasoning parsers per family, on model outputs written for the tests.

Every output is parsed whole, one character at a time, cut in two at every
position (inside tags, inside JSON strings) and in random pieces; all must give
the same content, reasoning and calls.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import pytest

from kronk_core.contract.errors import InvalidRequestError
from kronk_core.contract.templates import OutputParser
from kronk_core.contract.types import (
    ChatDelta,
    JsonSegment,
    StructuredOutput,
    ToolChoice,
    ToolSpec,
)
from kronk_templates.formats import FORMATS, detect_format, reasoning_opened, uses_think
from kronk_testing.streamed_calls import check_streamed_calls

SEEDS = 30

WEATHER = ToolSpec(
    "get_weather",
    "Weather for a city",
    json.dumps(
        {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "extra": {"type": "object"},
            },
            "required": ["city"],
        }
    ),
)
SEARCH = ToolSpec(
    "search",
    "Search the web",
    json.dumps(
        {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "number"}},
            "required": ["query"],
        }
    ),
)
TOOLS = (WEATHER, SEARCH)


@dataclass
class Parsed:
    content: str = ""
    reasoning: str = ""
    calls: list[tuple[str, Any]] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Options:
    parse_tools: bool = True
    think: bool = False
    reasoning_open: bool = False
    truncated: bool = False


def new_parser(family: str, options: Options) -> OutputParser:
    counter = itertools.count(1)
    return FORMATS[family].parser(
        tools=TOOLS,
        parse_tools=options.parse_tools,
        think=options.think,
        reasoning_open=options.reasoning_open,
        new_id=lambda: f"call_{next(counter)}",
    )


def _check_delta(delta: ChatDelta) -> None:
    parts = (delta.content, delta.reasoning, delta.tool_calls, delta.tool_call_deltas)
    assert sum(map(bool, parts)) == 1, delta
    for call in delta.tool_calls:
        arguments = json.loads(call.arguments)
        assert isinstance(arguments, dict)
        assert call.arguments == json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def run(family: str, pieces: list[str], options: Options = Options()) -> Parsed:
    parser = new_parser(family, options)
    deltas = [delta for piece in pieces for delta in parser.feed(piece)]
    deltas += parser.finish(truncated=options.truncated)
    check_streamed_calls(deltas)
    parsed = Parsed()
    for delta in deltas:
        _check_delta(delta)
        parsed.content += delta.content
        parsed.reasoning += delta.reasoning
        parsed.calls += [(call.name, json.loads(call.arguments)) for call in delta.tool_calls]
        parsed.ids += [call.id for call in delta.tool_calls]
    return parsed


def random_pieces(text: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
    return [text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])]


def splits(text: str) -> list[list[str]]:
    """Every way to cut `text` in two, one character at a time, and seeded random cuts."""
    ways = [[text], list(text)]
    ways += [[text[:at], text[at:]] for at in range(1, len(text))]
    ways += [random_pieces(text, seed) for seed in range(SEEDS)] if len(text) > 1 else []
    return ways


def check(family: str, text: str, expected: Parsed, options: Options = Options()) -> None:
    for pieces in splits(text):
        got = run(family, pieces, options)
        got.ids = []
        assert got == expected, pieces


def weather(city: str, **more: Any) -> tuple[str, Any]:
    return ("get_weather", {"city": city, **more})


# (family, model output, expected, options)
CASES: dict[str, tuple[str, str, Parsed, Options]] = {}


def case(name: str, family: str, text: str, expected: Parsed, options: Options = Options()) -> None:
    CASES[f"{family}-{name}"] = (family, text, expected, options)


HERMES_CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": '
    '{"city": "Zürich \\"</tool_call>\\" 東京", "days": 3}}\n</tool_call>'
)
HERMES_ARGS = weather('Zürich "</tool_call>" 東京', days=3)
SEARCH_CALL = '<tool_call>\n{"name": "search", "arguments": {"query": "kronk"}}\n</tool_call>'

case("plain", "hermes", "Hello <b>world</b> <tool", Parsed(content="Hello <b>world</b> <tool"))
case(
    "content-call",
    "hermes",
    "Let me check.\n" + HERMES_CALL,
    Parsed("Let me check.\n", "", [HERMES_ARGS]),
)
case(
    "several",
    "hermes",
    f"  {HERMES_CALL}\n\n{SEARCH_CALL}\n",
    Parsed(calls=[HERMES_ARGS, ("search", {"query": "kronk"})]),
)
case(
    "content-after",
    "hermes",
    f"{SEARCH_CALL}\nDone.",
    Parsed(content="\nDone.", calls=[("search", {"query": "kronk"})]),
)
case(
    "reasoning",
    "hermes",
    "<think>\nThe user wants weather.\n</think>\n\nChecking. " + HERMES_CALL,
    Parsed("Checking. ", "The user wants weather.", [HERMES_ARGS]),
    Options(think=True),
)
case(
    "reasoning-open",
    "hermes",
    "Need weather.</think>\n" + HERMES_CALL,
    Parsed("", "Need weather.", [HERMES_ARGS]),
    Options(reasoning_open=True),
)
case(
    "think-without-block",
    "hermes",
    "<thing> is not a block",
    Parsed(content="<thing> is not a block"),
    Options(think=True),
)
case(
    "truncated",
    "hermes",
    'Sure <tool_call>\n{"name": "search", "arguments": {"query": "kr',
    Parsed(content="Sure ", calls=[("search", {"query": "kr"})]),
    Options(truncated=True),
)
case(
    "truncated-in-key",
    "hermes",
    '<tool_call>\n{"name": "search", "arguments": {"query": "x", "lim',
    Parsed(calls=[("search", {"query": "x"})]),
    Options(truncated=True),
)
case(
    "truncated-before-arguments",
    "hermes",
    '<tool_call>\n{"name": "search", "argu',
    Parsed(content='<tool_call>\n{"name": "search", "argu'),
    Options(truncated=True),
)
case(
    "truncated-complete-json",
    "hermes",
    '<tool_call>{"name": "search", "arguments": {"query": "x"}}',
    Parsed(calls=[("search", {"query": "x"})]),
    Options(truncated=True),
)
case(
    "stopped-unclosed",
    "hermes",
    '<tool_call>{"name": "search", "arguments": {"query": "x"}}\n</tool',
    Parsed(calls=[("search", {"query": "x"})]),
)
case(
    "stopped-incomplete",
    "hermes",
    '<tool_call>{"name": "search", "arguments": {"query": "x"}',
    Parsed(calls=[("search", {"query": "x"})]),
)
case(
    "stopped-before-arguments",
    "hermes",
    '<tool_call>{"name": "search"',
    Parsed(content='<tool_call>{"name": "search"'),
)
case(
    "arguments-before-name",
    "hermes",
    '<tool_call>{"arguments": {"query": "q"}, "name": "search"}</tool_call>',
    Parsed(calls=[("search", {"query": "q"})]),
)
case(
    "broken-after-start",
    "hermes",
    '<tool_call>{"name": "search", "arguments": {"query": "q", oops}}</tool_call>',
    Parsed(calls=[("search", {"query": "q"})]),
)
case(
    "bad-json",
    "hermes",
    '<tool_call>{"name": "search", arguments: {}}</tool_call> ok',
    Parsed(content='<tool_call>{"name": "search", arguments: {}}</tool_call> ok'),
)
case(
    "no-name",
    "hermes",
    '<tool_call>{"arguments": {}}</tool_call>',
    Parsed(content='<tool_call>{"arguments": {}}</tool_call>'),
)
case(
    "arguments-not-object",
    "hermes",
    '<tool_call>{"name": "search", "arguments": [1]}</tool_call>',
    Parsed(content='<tool_call>{"name": "search", "arguments": [1]}</tool_call>'),
)
case(
    "text-after-json",
    "hermes",
    '<tool_call>{"name": "search", "arguments": {}} oops</tool_call>',
    Parsed(content=" oops</tool_call>", calls=[("search", {})]),
)
case(
    "arguments-as-string",
    "hermes",
    '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"a\\\\\\\\b\\"}"}</tool_call>',
    Parsed(calls=[("search", {"query": "a\\b"})]),
)
case("no-tools", "hermes", SEARCH_CALL, Parsed(content=SEARCH_CALL), Options(parse_tools=False))

QWEN_CALL = (
    "<tool_call>\n<function=get_weather>\n"
    "<parameter=city>\nNew York\n<b>NYC</b> </param\n</parameter>\n"
    "<parameter=days>\n5\n</parameter>\n"
    "<parameter=metric>\nTrue\n</parameter>\n"
    '<parameter=extra>\n{"units": ["C", "F"]}\n</parameter>\n'
    "</function>\n</tool_call>"
)
QWEN_ARGS = weather(
    "New York\n<b>NYC</b> </param", days=5, metric=True, extra={"units": ["C", "F"]}
)
QWEN_SEARCH = (
    "<tool_call>\n<function=search>\n<parameter=query>\nnull\n</parameter>\n"
    "<parameter=limit>\n2.5\n</parameter>\n<parameter=unknown>\n7\n</parameter>\n"
    "</function>\n</tool_call>"
)
QWEN_SEARCH_ARGS = ("search", {"query": None, "limit": 2.5, "unknown": "7"})

case("call", "qwen3_coder", QWEN_CALL, Parsed(calls=[QWEN_ARGS]))
case(
    "content-calls",
    "qwen3_coder",
    f"I'll look.\n\n{QWEN_CALL}\n{QWEN_SEARCH}\n",
    Parsed("I'll look.\n\n", "", [QWEN_ARGS, QWEN_SEARCH_ARGS]),
)
case(
    "loose-values",
    "qwen3_coder",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n<parameter=days>\nsoon\n"
    "</parameter>\n<parameter=extra>\n{bad\n</parameter>\n</function>\n</tool_call>",
    Parsed(calls=[weather("Rome", days="soon", extra="{bad")]),
)
case(
    "unknown-tool",
    "qwen3_coder",
    "<tool_call>\n<function=other>\n<parameter=n>\n1\n</parameter>\n</function>\n</tool_call>",
    Parsed(calls=[("other", {"n": "1"})]),
)
case(
    "stopped-unclosed",
    "qwen3_coder",
    "<tool_call>\n<function=search>\n<parameter=query>\nx\n</parameter>\n</function>\n",
    Parsed(calls=[("search", {"query": "x"})]),
)
case(
    "truncated",
    "qwen3_coder",
    "<tool_call>\n<function=search>\n<parameter=query>\nx\n</parameter>\n</function>\n",
    Parsed(calls=[("search", {"query": "x"})]),
    Options(truncated=True),
)
case(
    "truncated-in-value",
    "qwen3_coder",
    "<tool_call>\n<function=get_weather>\n<parameter=days>\n5\n</parameter>\n"
    "<parameter=city>\nNew Yo",
    Parsed(calls=[weather("New Yo", days=5)]),
    Options(truncated=True),
)
case(
    "truncated-in-number",
    "qwen3_coder",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
    "<parameter=days>\n1",
    Parsed(calls=[weather("Rome")]),
    Options(truncated=True),
)
case(
    "broken-after-start",
    "qwen3_coder",
    "<tool_call>\n<function=search>\n<parameter=query>\nx\n</parameter>\noops\n</tool_call>",
    Parsed(calls=[("search", {"query": "x"})]),
)
case(
    "malformed",
    "qwen3_coder",
    "<tool_call>\nsearch(query=x)\n</tool_call>",
    Parsed(content="<tool_call>\nsearch(query=x)\n</tool_call>"),
)
case("no-tools", "qwen3_coder", QWEN_CALL, Parsed(content=QWEN_CALL), Options(parse_tools=False))

LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}'
case("json", "llama3", LLAMA_CALL, Parsed(calls=[weather("Paris", days=2)]))
case(
    "typed-several",
    "llama3",
    '\n{"type": "function", "name": "search", "parameters": {"query": "a; b"}}; ' + LLAMA_CALL,
    Parsed(calls=[("search", {"query": "a; b"}), weather("Paris", days=2)]),
)
case(
    "content-first",
    "llama3",
    "Here it is: " + LLAMA_CALL,
    Parsed(content="Here it is: " + LLAMA_CALL),
)
case(
    "json-answer",
    "llama3",
    '{"city": "Paris"} is the answer',
    Parsed(content='{"city": "Paris"} is the answer'),
)
case(
    "builtin",
    "llama3",
    '<|python_tag|>brave_search.call(query="weather \\"Paris\\"", count=3)',
    Parsed(calls=[("brave_search", {"query": 'weather "Paris"', "count": 3})]),
)
case(
    "python-tag-json",
    "llama3",
    "<|python_tag|>" + LLAMA_CALL,
    Parsed(calls=[weather("Paris", days=2)]),
)
case(
    "code",
    "llama3",
    "<|python_tag|>import math\nprint(math.pi)",
    Parsed(calls=[("python", {"code": "import math\nprint(math.pi)"})]),
)
case(
    "truncated",
    "llama3",
    "<|python_tag|>brave_search.call(query=",
    Parsed(content="<|python_tag|>brave_search.call(query="),
    Options(truncated=True),
)
case(
    "truncated-json",
    "llama3",
    '{"name": "search", "parameters": {"query": "x',
    Parsed(calls=[("search", {"query": "x"})]),
    Options(truncated=True),
)
case("no-tools", "llama3", LLAMA_CALL, Parsed(content=LLAMA_CALL), Options(parse_tools=False))

HARMONY_ANALYSIS = "<|channel|>analysis<|message|>User wants <b>weather</b>.<|end|>"
HARMONY_CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Oslo <|end|>"}<|call|>'
)
case(
    "final",
    "harmony",
    HARMONY_ANALYSIS + "<|start|>assistant<|channel|>final<|message|>It is <sunny>.<|return|>",
    Parsed("It is <sunny>.", "User wants <b>weather</b>."),
)
case(
    "call",
    "harmony",
    HARMONY_ANALYSIS + HARMONY_CALL,
    Parsed("", "User wants <b>weather</b>.", [weather("Oslo <|end|>")]),
)
case(
    "recipient-in-role",
    "harmony",
    ' to=functions.search<|channel|>commentary json<|message|>{"query": "q"}<|call|>',
    Parsed(calls=[("search", {"query": "q"})]),
)
case(
    "preamble",
    "harmony",
    "<|channel|>commentary<|message|>Checking.<|end|>" + HARMONY_CALL,
    Parsed("Checking.", "", [weather("Oslo <|end|>")]),
)
case(
    "stopped-unended",
    "harmony",
    '<|channel|>commentary to=functions.search <|constrain|>json<|message|>{"query": "q"}',
    Parsed(calls=[("search", {"query": "q"})]),
)
case(
    "truncated",
    "harmony",
    '<|channel|>commentary to=functions.search<|message|>{"query": "q"}',
    Parsed(calls=[("search", {"query": "q"})]),
    Options(truncated=True),
)
case(
    "malformed",
    "harmony",
    "<|channel|>commentary to=functions.search<|message|>query=q<|call|>",
    Parsed(content="<|channel|>commentary to=functions.search<|message|>query=q<|call|>"),
)
case(
    "truncated-final",
    "harmony",
    "<|channel|>analysis<|message|>Hm<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Partial ans",
    Parsed("Partial ans", "Hm"),
    Options(truncated=True),
)
case(
    "plain", "harmony", "Just text, <|no|> channels.", Parsed(content="Just text, <|no|> channels.")
)
case(
    "no-tools",
    "harmony",
    HARMONY_CALL,
    Parsed(content=HARMONY_CALL),
    Options(parse_tools=False),
)

case(
    "array",
    "mistral",
    'Calling.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lyon [ARGS]"}, '
    '"id": "abc123XYZ"}, '
    '{"name": "search", "arguments": "{\\"query\\": \\"q\\"}"}]',
    Parsed("Calling.", "", [weather("Lyon [ARGS]"), ("search", {"query": "q"})]),
)
case(
    "args",
    "mistral",
    '[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon }"}'
    '[TOOL_CALLS]search[CALL_ID]a1b2c3d4e[ARGS]{"query": "q"}',
    Parsed(calls=[weather("Lyon }"), ("search", {"query": "q"})]),
)
case(
    "think",
    "mistral_nemo",
    '[THINK]Plan.[/THINK]Ok[TOOL_CALLS]search[ARGS]{"query": "q"}',
    Parsed("Ok", "Plan.", [("search", {"query": "q"})]),
    Options(think=True),
)
case(
    "truncated",
    "mistral",
    '[TOOL_CALLS]search[ARGS]{"query": "q',
    Parsed(calls=[("search", {"query": "q"})]),
    Options(truncated=True),
)
case(
    "malformed",
    "mistral",
    "[TOOL_CALLS]search[ARGS]query then text",
    Parsed(content="[TOOL_CALLS]search[ARGS]query then text"),
)

GEMMA_CALL = '{"name": "get_weather", "arguments": {"city": "Köln \\"{\\"", "days": 1}}'
GEMMA_ARGS = weather('Köln "{"', days=1)
case("bare", "gemma", "\n" + GEMMA_CALL, Parsed(calls=[GEMMA_ARGS]))
case(
    "lines",
    "gemma",
    GEMMA_CALL + '\n{"name": "search", "arguments": {"query": "q"}}\nDone.',
    Parsed(content="\nDone.", calls=[GEMMA_ARGS, ("search", {"query": "q"})]),
)
case(
    "array",
    "gemma",
    '[{"name": "search", "arguments": {"query": "q"}}, ' + GEMMA_CALL + "]",
    Parsed(calls=[("search", {"query": "q"}), GEMMA_ARGS]),
)
case("json-fence", "gemma", f"```json\n{GEMMA_CALL}\n```", Parsed(calls=[GEMMA_ARGS]))
case(
    "tool-code-fence",
    "gemma",
    f'```tool_code\n{GEMMA_CALL}\n{{"name": "search", "arguments": {{"query": "q"}}}}\n```\n',
    Parsed(calls=[GEMMA_ARGS, ("search", {"query": "q"})]),
)
case("prose", "gemma", "Sure: " + GEMMA_CALL, Parsed(content="Sure: " + GEMMA_CALL))
case(
    "other-fence",
    "gemma",
    "```python\nprint({})\n```",
    Parsed(content="```python\nprint({})\n```"),
)
case(
    "not-a-call",
    "gemma",
    ' {"name": "Bob", "age": 3}\n',
    Parsed(content=' {"name": "Bob", "age": 3}\n'),
)
case(
    "no-arguments",
    "gemma",
    '{"name": "search"}',
    Parsed(content='{"name": "search"}'),
)
case(
    "reasoning",
    "gemma",
    "<think>Call it.</think>" + GEMMA_CALL,
    Parsed("", "Call it.", [GEMMA_ARGS]),
    Options(think=True),
)
case(
    "truncated",
    "gemma",
    '{"name": "search", "arguments": {"query": "q"',
    Parsed(calls=[("search", {"query": "q"})]),
    Options(truncated=True),
)
case("no-tools", "gemma", GEMMA_CALL, Parsed(content=GEMMA_CALL), Options(parse_tools=False))


@pytest.mark.parametrize("name", CASES)
def test_parses_every_split(name: str) -> None:
    family, text, expected, options = CASES[name]
    check(family, text, expected, options)


def test_ids_come_from_new_id() -> None:
    parsed = run("hermes", [HERMES_CALL + SEARCH_CALL])
    assert parsed.ids == ["call_1", "call_2"]


@pytest.mark.parametrize("family", ["mistral", "mistral_nemo"])
def test_mistral_ids_are_nine_alphanumerics(family: str) -> None:
    # An id after the arguments comes too late: the call streamed under a fresh one.
    text = (
        '[TOOL_CALLS][{"id": "abc123XYZ", "name": "search", "arguments": {}}, '
        '{"name": "search", "arguments": {}, "id": "call_1"}, '
        '{"name": "search", "arguments": {}, "id": "xyz987ABC"}]'
    )
    ids = run(family, [text]).ids
    assert ids[0] == "abc123XYZ"
    assert all(re.fullmatch("[a-zA-Z0-9]{9}", id) for id in ids[1:]) and ids[2] != "xyz987ABC"
    assert ids == run(family, [text]).ids  # derived from new_id, so reproducible


def test_reasoning_streams_before_the_block_ends() -> None:
    parser = new_parser("hermes", Options(think=True))
    deltas = parser.feed("<think>\nStep one, ") + parser.feed("step two")
    assert "".join(d.reasoning for d in deltas) == "Step one, step two"
    assert parser.finish(truncated=True) == []


def test_content_streams_before_the_message_ends() -> None:
    parser = new_parser("hermes", Options())
    assert parser.feed("Hello <tool") == [ChatDelta(content="Hello ")]
    assert parser.feed("box>") == [ChatDelta(content="<toolbox>")]


# What the model writes under each constraint.
ARGUMENTS: dict[str, dict[str, Any]] = {
    "get_weather": {"city": "Paris", "days": 2},
    "search": {"query": "kronk"},
}
JSON_FAMILIES = ["hermes", "llama3", "harmony", "mistral", "mistral_nemo", "gemma"]


def _written(segment: JsonSegment) -> tuple[str, list[str]]:
    """What a model writes under `segment` (checked against its schema), and the tools it calls."""
    schema = json.loads(segment.schema)
    if schema.get("type") == "array":  # one array of calls (Mistral Nemo)
        options = schema["items"].get("anyOf", [schema["items"]])
        names = [option["properties"]["name"]["const"] for option in options]
        value: object = [{"name": name, "arguments": ARGUMENTS[name]} for name in names]
    elif "name" in schema.get("properties", {}):  # a call object with the name pinned
        names = [schema["properties"]["name"]["const"]]
        key = next(key for key in schema["properties"] if key != "name")
        value = {"name": names[0], key: ARGUMENTS[names[0]]}
    else:  # bare arguments, the name in the prefix
        names = [name for name in ARGUMENTS if name in segment.prefix]
        value = ARGUMENTS[names[0]]
    jsonschema.validate(value, schema)
    return segment.prefix + json.dumps(value) + segment.suffix, names


@pytest.mark.parametrize("family", JSON_FAMILIES)
@pytest.mark.parametrize(
    ("choice", "names"),
    [
        (ToolChoice("required"), ["get_weather", "search"]),
        (ToolChoice("function", "search"), ["search"]),
    ],
)
def test_constrained_output_parses_back(family: str, choice: ToolChoice, names: list[str]) -> None:
    constraint = FORMATS[family].constraint(TOOLS, choice, True)
    assert isinstance(constraint, StructuredOutput)
    written = [_written(segment) for segment in constraint.choices]
    assert [name for _, called in written for name in called] == names
    outputs = (
        ["".join(text for text, _ in written)] if constraint.repeat else [t for t, _ in written]
    )
    calls = [call for output in outputs for call in run(family, [output]).calls]
    assert calls == [(name, ARGUMENTS[name]) for name in names]


@pytest.mark.parametrize("family", JSON_FAMILIES)
def test_one_call_without_parallel(family: str) -> None:
    constraint = FORMATS[family].constraint(TOOLS, ToolChoice("required"), False)
    assert isinstance(constraint, StructuredOutput)
    assert not constraint.repeat
    if family == "mistral_nemo":
        assert json.loads(constraint.choices[0].schema)["maxItems"] == 1


@pytest.mark.parametrize("family", [*JSON_FAMILIES, "qwen3_coder"])
def test_constraint_rejects_unknown_function(family: str) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        FORMATS[family].constraint(TOOLS, ToolChoice("function", "nope"), True)
    assert raised.value.param == "tool_choice"


def _rules(grammar: str) -> dict[str, str]:
    return dict(line.split(" ::= ", 1) for line in grammar.splitlines() if " ::= " in line)


def test_qwen3_coder_grammar_is_complete() -> None:
    grammar = FORMATS["qwen3_coder"].constraint(TOOLS, ToolChoice("required"), True)
    assert isinstance(grammar, str)
    rules = _rules(grammar)
    assert "root" in rules
    for body in rules.values():
        bare = re.sub(r'"(\\.|[^"\\])*"|\[(\\.|[^\]\\])*\]', " ", body)
        for name in re.findall(r"[a-z][a-z0-9-]*", bare):
            assert name in rules, name
    assert '"<function=get_weather>\\n" param-0-0 param-0-1? param-0-2? param-0-3?' in grammar
    assert 'param-0-1 ::= "<parameter=days>\\n" json-int' in grammar
    assert 'root ::= call ( "\\n" call )*' in grammar


def test_qwen3_coder_grammar_for_one_function() -> None:
    grammar = FORMATS["qwen3_coder"].constraint(TOOLS, ToolChoice("function", "search"), False)
    assert isinstance(grammar, str)
    assert "root ::= call\n" in grammar
    assert "<function=search>" in grammar and "<function=get_weather>" not in grammar


def test_qwen3_coder_grammar_output_parses_back() -> None:
    # Written the way the grammar lays it out: a newline around every value, calls one per line.
    written = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=search>\n<parameter=query>\nkronk\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    calls = run("qwen3_coder", [written]).calls
    assert calls == [("get_weather", ARGUMENTS["get_weather"]), ("search", ARGUMENTS["search"])]


TEMPLATES = {
    "qwen3_coder": "<tool_call>\n<function={{ tool_call.name }}>\n<parameter=",
    "hermes": "<tools>{{ tool | tojson }}</tools> <tool_call>\n{{ call | tojson }}\n</tool_call>",
    "harmony": "<|start|>assistant<|channel|>final<|message|>",
    "mistral": "[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]{{ name }}[ARGS]{{ a }}",
    "mistral_nemo": "[TOOL_CALLS][{{ calls | tojson }}]",
    "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "llama3-builtin": "{%- if builtin_tools %}<|python_tag|>{% endif %}<|eot_id|>",
    "chatml": "<|im_start|>assistant\n",
}


@pytest.mark.parametrize("name", TEMPLATES)
def test_detect_format(name: str) -> None:
    expected = {"llama3-builtin": "llama3", "chatml": "hermes"}.get(name, name)
    assert detect_format(TEMPLATES[name], "llama") == expected


def test_detect_format_without_template() -> None:
    assert detect_format(None, "gemma3") == "gemma"
    assert detect_format("", "llama") == "gemma"
    assert detect_format("<start_of_turn>model\n", "gemma3") == "gemma"
    assert detect_format("<start_of_turn>model\n<tool_call>", "gemma3") == "hermes"


def test_uses_think_and_reasoning_opened() -> None:
    assert uses_think("{% if enable_thinking %}<think>\n\n</think>{% endif %}")
    assert uses_think("[THINK]")
    assert not uses_think(TEMPLATES["chatml"])
    assert not uses_think(None)
    assert reasoning_opened("<|im_start|>assistant\n<think>\n")
    assert not reasoning_opened("<|im_start|>assistant\n<think>\n\n</think>\n\n")
