"""Grammars: measured before llama.cpp sees them, compiled once per source, cloned per request."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from kronk_core import ModelConfig
from kronk_core.contract.errors import InvalidRequestError, LimitExceededError
from kronk_core.contract.sampling import (
    CompiledGrammar,
    Grammar,
    Greedy,
    JsonSchemaGrammar,
    StructuredGrammar,
    Temperature,
)
from kronk_core.contract.types import JsonSegment, StructuredOutput
from kronk_llamacpp.grammar_limits import GbnfSyntaxError, GrammarTooDeepError, measure
from kronk_llamacpp.model import LlamaTextModel
from kronk_llamacpp.packaged import DEFAULT_MODEL_ID, default_model_path

KEY = f"models.{DEFAULT_MODEL_ID}.llamacpp.structured_output"


# ---- measuring GBNF --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gbnf", "depth", "branches"),
    [
        ('root ::= "a"', 1, 1),
        ('root ::= "a" | "b" | "c"', 1, 3),
        ('root ::= ("a" | "b") ("c" | "d" | "e")', 2, 3),
        # Optional items open their own branches and the next item's.
        ('root ::= "a"? "b"? "c"', 2, 3),
        ('root ::= x\nx ::= y\ny ::= "a" | "b"', 3, 2),
        # Each copy of a nullable x opens x's branches: llama.cpp unrolls the repetition.
        ('root ::= ("a"?){5} "b"', 4, 6),
        ('# comment\nroot ::= [a-z]+ "." # tail\n', 2, 1),
        ('root ::= "" "a"', 1, 1),  # an empty literal adds nothing
        ("root ::= <[12]> !<[3]>", 1, 1),
    ],
)
def test_measure_reads_depth_and_branches(gbnf: str, depth: int, branches: int) -> None:
    shape = measure(gbnf, "root", max_depth=100, cap=1000)
    assert (shape.depth, shape.branches) == (depth, branches)
    assert shape.size == len(gbnf.encode())


def test_branches_double_with_each_rule_that_uses_the_one_before_twice() -> None:
    rules = ['r0 ::= "x"?', *(f"r{i} ::= r{i - 1} r{i - 1}" for i in range(1, 12))]
    shape = measure("\n".join(['root ::= r11 "y"', *rules]), "root", max_depth=100, cap=10**6)
    assert shape.branches == 2**11 + 1  # every x of r11's 2^11, and the "y" after none of them
    capped = measure("\n".join(['root ::= r11 "y"', *rules]), "root", max_depth=100, cap=100)
    assert capped.branches == 100


def test_depth_counts_parentheses_and_chains_of_first_rules_without_recursing() -> None:
    chain = "\n".join(
        ["root ::= r0", *(f"r{i} ::= r{i + 1}" for i in range(50_000)), 'r50000 ::= "a"']
    )
    assert measure(chain, "root", max_depth=10, cap=10).depth == 50_002
    nested = "root ::= " + "(" * 50_000 + '"a"' + ")" * 50_000
    with pytest.raises(GrammarTooDeepError, match="deeper than 2048"):
        measure(nested, "root", max_depth=2048, cap=10)
    assert measure("root ::= " + "(" * 100 + '"a"' + ")" * 100, "root", 2048, 10).depth == 101


@pytest.mark.parametrize(
    "gbnf",
    [
        "root ::= (",
        'root ::= "a" bogus',
        'root ::= "\\q"',
        "",
        'x ::= "a"',
        'root ::= "a"\n  | "b"',
    ],
)
def test_measure_refuses_what_llama_cpp_refuses(gbnf: str) -> None:
    with pytest.raises(GbnfSyntaxError):
        measure(gbnf, "root", max_depth=100, cap=10)


# ---- compiling on a real model -------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> Iterator[LlamaTextModel]:
    config = ModelConfig.model_validate(
        {
            "id": DEFAULT_MODEL_ID,
            "model_path": default_model_path(),
            "context_window": 256,
            "n_seq_max": 1,
            "llamacpp": {"structured_output": {"cache_entries": 2, "max_enum_values": 300}},
        }
    )
    loaded = LlamaTextModel(config)
    yield loaded
    loaded.close()


def _schema(schema: object) -> JsonSchemaGrammar:
    return JsonSchemaGrammar(json.dumps(schema))


def test_a_source_compiles_once_and_every_request_gets_its_own_clone(model: LlamaTextModel) -> None:
    stage = _schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    first, second = model.compile_stages([stage, Greedy()]), model.compile_stages([stage])
    assert isinstance(first[0], CompiledGrammar) and first[1] == Greedy()
    assert isinstance(second[0], CompiledGrammar)
    assert first[0].native is second[0].native  # the cache's, not compiled again
    samplers = [model.new_sampler([compiled, Greedy()]) for compiled in (first[0], second[0])]
    for sampler in samplers:
        sampler.close()


def test_the_cache_keeps_its_latest_entries_and_a_compiled_grammar_outlives_its_entry(
    model: LlamaTextModel,
) -> None:
    stages = [_schema({"enum": [f"v{i}" for i in range(n)]}) for n in (1, 2, 3)]
    compiled = [model.compile_stages([stage])[0] for stage in stages]
    assert isinstance(compiled[0], CompiledGrammar)
    again = model.compile_stages([stages[0]])[0]  # evicted (cache_entries 2): compiled anew
    assert isinstance(again, CompiledGrammar) and again.native is not compiled[0].native
    latest = model.compile_stages([stages[2]])[0]
    assert isinstance(latest, CompiledGrammar) and latest.native is compiled[2].native
    # The evicted one still builds samplers for the requests that hold it.
    model.new_sampler([compiled[0], Temperature(0.8), Greedy()]).close()


def test_an_enum_is_a_tree_of_shared_prefixes(model: LlamaTextModel) -> None:
    """300 values that share "value number ": a handful of branches at any point, not 300."""
    values = [f"value number {i}" for i in range(300)]
    compiled = model.compile_stages([_schema({"enum": values})])[0]
    assert isinstance(compiled, CompiledGrammar)
    with pytest.raises(LimitExceededError, match=f"301 values.*{KEY}.max_enum_values"):
        model.compile_stages([_schema({"enum": [*values, "one more"]})])


@pytest.mark.parametrize(
    ("stage", "words"),
    [
        (_schema({"type": "string", "maxLength": 1001}), ("maxLength is 1001", "max_repetition")),
        (_schema({"type": "string", "pattern": "^(ab){2,5000}$"}), ("5000 times",)),
        # Spellings the converter's parser reads (split on ",", then int()).
        (_schema({"type": "string", "pattern": "^a{,5000}$"}), ("5000 times", "max_repetition")),
        (_schema({"type": "string", "pattern": "^a{+5000}$"}), ("5000 times", "max_repetition")),
        (_schema({"type": "string", "pattern": "^a{5_000}$"}), ("5000 times", "max_repetition")),
        # Each repetition within max_repetition, together past max_grammar_bytes: refused as
        # the grammar grows, before it is all written out.
        (
            _schema({"type": "string", "pattern": "^" + "([a-z]){1000}" * 200 + "$"}),
            ("too large", "max_grammar_bytes"),
        ),
        (_schema({"anyOf": [{"const": i} for i in range(129)]}), ("129 alternatives",)),
        (_schema({"type": ["string"] * 129}), ("129 types", "max_alternatives")),
        (
            StructuredGrammar(
                StructuredOutput(
                    tuple(JsonSegment('{"type": "object"}', f"<{i}>") for i in range(129))
                )
            ),
            ("129 tools", "max_alternatives"),
        ),
        (
            Grammar("root ::= " + " | ".join(f'"{i}"' for i in range(257))),
            ("max_grammar_branches",),
        ),
        (Grammar("root ::= " + "(" * 3000 + '"a"' + ")" * 3000), ("max_grammar_depth",)),
    ],
)
def test_past_a_limit_the_error_names_its_key(
    model: LlamaTextModel, stage: JsonSchemaGrammar | Grammar, words: tuple[str, ...]
) -> None:
    with pytest.raises(LimitExceededError) as caught:
        model.compile_stages([stage])
    assert KEY in caught.value.message
    for word in words:
        assert word in caught.value.message


@pytest.mark.parametrize(
    ("stage", "words"),
    [
        (Grammar(" \n"), ("empty grammar",)),
        (Grammar("root ::= ("), ("does not parse",)),
        (Grammar('root ::= "\ud800"'), ("not valid Unicode",)),
        (_schema({"$ref": "https://example.com/schema"}), ("cannot be turned into a grammar",)),
        (JsonSchemaGrammar("{not json"), ("not valid JSON",)),
    ],
)
def test_what_does_not_compile_is_an_invalid_request(
    model: LlamaTextModel, stage: JsonSchemaGrammar | Grammar, words: tuple[str, ...]
) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        model.compile_stages([stage])
    for word in words:
        assert word in caught.value.message


def test_a_conversion_past_its_time_is_stopped() -> None:
    config = ModelConfig.model_validate(
        {
            "id": DEFAULT_MODEL_ID,
            "model_path": default_model_path(),
            "context_window": 64,
            "n_seq_max": 1,
            "llamacpp": {"structured_output": {"compile_seconds": 0.001}},
        }
    )
    slow = LlamaTextModel(config)
    try:
        # Optional properties: the converter's work grows with their square.
        schema = {
            "type": "object",
            "properties": {f"p{i}": {"type": "integer"} for i in range(900)},
        }
        with pytest.raises(LimitExceededError, match=f"took too long.*{KEY}.compile_seconds"):
            slow.compile_stages([_schema(schema)])
    finally:
        slow.close()
