"""Tool-call arguments stream as the model writes them, in every format.

Random arguments, written as each family writes them (spaces, escapes, key
order as JSON allows), are fed in random small pieces: each call's name comes
first, its fragments add up to its arguments, and those are the compact JSON
of what the model wrote, however the text was cut.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from kronk_core.contract.types import ChatDelta, ToolSpec
from kronk_templates.formats import FORMATS
from kronk_templates.formats.calls import compact_json
from kronk_testing.streamed_calls import check_streamed_calls

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
KEYS = st.text("abcxyz_", min_size=1, max_size=6)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.floats(-1e6, 1e6), TEXT
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=3)
    ),
    max_leaves=8,
)
ARGUMENTS = st.dictionaries(KEYS, VALUES, max_size=4)
NAME = "get_weather"


def dumps(value: object, spaced: bool, ascii_only: bool) -> str:
    separators = (", ", ": ") if spaced else (",", ":")
    return json.dumps(value, separators=separators, ensure_ascii=ascii_only)


def pieces(data: st.DataObject, text: str) -> list[str]:
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=30).map(sorted))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def parse(family: str, chunks: list[str], tools: tuple[ToolSpec, ...] = ()) -> list[ChatDelta]:
    parser = FORMATS[family].parser(
        tools=tools, parse_tools=True, think=False, reasoning_open=False, new_id=lambda: "call_x"
    )
    deltas = [delta for chunk in chunks for delta in parser.feed(chunk)]
    return deltas + parser.finish(truncated=False)


def assert_streams(family: str, text: str, data: st.DataObject, expected: list[str]) -> None:
    chunks = pieces(data, text)
    deltas = parse(family, chunks)
    check_streamed_calls(deltas)
    calls = [call for delta in deltas for call in delta.tool_calls]
    assert [(call.name, call.arguments) for call in calls] == [(NAME, a) for a in expected], chunks
    heads = [piece for delta in deltas for piece in delta.tool_call_deltas if piece.name]
    assert [head.name for head in heads] == [NAME] * len(expected)
    assert all(delta.content.strip() == "" for delta in deltas)


Writer = Callable[[str], str]

# Each family's markup around one call's arguments (JSON text).
JSON_FORMATS: dict[str, Writer] = {
    "hermes": lambda args: f'<tool_call>\n{{"name": "{NAME}", "arguments": {args}}}\n</tool_call>',
    "gemma": lambda args: f'{{"name": "{NAME}", "arguments": {args}}}\n',
    "llama3": lambda args: f'{{"name": "{NAME}", "parameters": {args}}}',
    "mistral": lambda args: f"[TOOL_CALLS]{NAME}[ARGS]{args}",
    "mistral_nemo": lambda args: f'[TOOL_CALLS][{{"name": "{NAME}", "arguments": {args}}}]',
    "harmony": lambda args: (
        f"<|channel|>commentary to=functions.{NAME} <|constrain|>json<|message|>{args}<|call|>"
    ),
}


@settings(max_examples=60, deadline=None)
@given(
    family=st.sampled_from(sorted(JSON_FORMATS)),
    arguments=ARGUMENTS,
    spaced=st.booleans(),
    ascii_only=st.booleans(),
    data=st.data(),
)
def test_json_arguments_stream(
    family: str, arguments: dict[str, object], spaced: bool, ascii_only: bool, data: st.DataObject
) -> None:
    text = JSON_FORMATS[family](dumps(arguments, spaced, ascii_only))
    assert_streams(family, text, data, [compact_json(arguments)])


@settings(max_examples=30, deadline=None)
@given(calls=st.lists(ARGUMENTS, min_size=1, max_size=3), data=st.data())
def test_several_calls_stream_one_after_another(
    calls: list[dict[str, object]], data: st.DataObject
) -> None:
    text = "\n".join(JSON_FORMATS["hermes"](dumps(args, True, False)) for args in calls)
    assert_streams("hermes", text, data, [compact_json(args) for args in calls])
    array = ", ".join(f'{{"name": "{NAME}", "arguments": {dumps(a, True, True)}}}' for a in calls)
    assert_streams("gemma", f"[{array}]", data, [compact_json(args) for args in calls])


QWEN_TOOL = ToolSpec(
    NAME,
    parameters_json=json.dumps(
        {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "note": {"type": "string"},
                "days": {"type": "integer"},
                "extra": {"type": "object"},
            },
        }
    ),
)
# Raw string values as Qwen3-Coder writes them: any text but the tags that end a value.
RAW = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=16).filter(
    lambda text: "<parameter=" not in text
    and "</parameter>" not in text
    and "</tool_call>" not in text
    and "</function>" not in text
)


@settings(max_examples=80, deadline=None)
@given(
    city=RAW,
    note=st.one_of(st.just("null"), st.just("nul"), st.just("\n"), RAW),
    days=st.integers(-1000, 1000),
    extra=st.dictionaries(KEYS, SCALARS, max_size=2),
    data=st.data(),
)
def test_qwen3_coder_arguments_stream(
    city: str, note: str, days: int, extra: dict[str, object], data: st.DataObject
) -> None:
    text = (
        f"<tool_call>\n<function={NAME}>\n<parameter=city>\n{city}\n</parameter>\n"
        f"<parameter=days>\n{days}\n</parameter>\n<parameter=note>\n{note}\n</parameter>\n"
        f"<parameter=extra>\n{json.dumps(extra)}\n</parameter>\n</function>\n</tool_call>"
    )
    whole = parse("qwen3_coder", [text], (QWEN_TOOL,))
    expected = [call.arguments for delta in whole for call in delta.tool_calls]
    decoded = {
        "city": None if city.lower() == "null" else city,
        "days": days,
        "note": None if note.lower() == "null" else note,
        "extra": extra,
    }
    assert expected == [compact_json(decoded)]
    chunks = pieces(data, text)
    deltas = parse("qwen3_coder", chunks, (QWEN_TOOL,))
    check_streamed_calls(deltas)
    assert [call.arguments for delta in deltas for call in delta.tool_calls] == expected, chunks


def test_arguments_stream_before_the_call_ends() -> None:
    """Fragments go out as the text arrives, not when the call closes."""
    for family, write in JSON_FORMATS.items():
        parser = FORMATS[family].parser(
            tools=(), parse_tools=True, think=False, reasoning_open=False, new_id=lambda: "c"
        )
        text = write('{"city": "Paris", "note": "long text"}')
        cut = text.index("long") + 2
        deltas = parser.feed(text[:cut])
        streamed = "".join(p.arguments for d in deltas for p in d.tool_call_deltas)
        assert streamed == '{"city":"Paris","note":"lo', family
        assert not any(d.tool_calls for d in deltas)
    parser = FORMATS["qwen3_coder"].parser(
        tools=(QWEN_TOOL,), parse_tools=True, think=False, reasoning_open=False, new_id=lambda: "c"
    )
    deltas = parser.feed(f"<tool_call>\n<function={NAME}>\n<parameter=city>\nPar")
    assert next(p for d in deltas for p in d.tool_call_deltas).name == NAME
    assert "".join(p.arguments for d in deltas for p in d.tool_call_deltas) == '{"city":"Par'
