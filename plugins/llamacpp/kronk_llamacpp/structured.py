"""JSON schemas and forced tool calls into GBNF, within the model's structured-output limits.

llama-cpp-python's converter writes repetitions out in full (`minItems: 1e9`
is a billion copies of the item, built in memory before anything fails) and
an enum as one alternative per value. So the schema is measured before it is
converted, and the conversion itself is bounded where its work happens: every
repetition the converter builds (a pattern's quantifier in any spelling its
parser takes, `minItems`, `maxLength`, ...) and every rule it adds passes
through `_Work`, which refuses a count past `max_repetition`, a grammar that
would grow past `max_grammar_bytes` (measured before the repetition's text is
built) and work past `compile_seconds`. Enums are written as a tree of their
shared prefixes: the same language, with as many open branches as a value has
possible next characters instead of one per value.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from llama_cpp import llama_grammar
from llama_cpp.llama_grammar import RESERVED_NAMES, SchemaConverter

from kronk_core.contract import InvalidRequestError, LimitExceededError, StructuredOutput
from kronk_llamacpp.settings import StructuredOutputLimits

# Keywords whose number the converter writes out that many times (or will, in later
# versions of the converter).
REPETITION_KEYWORDS = (
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minProperties",
    "maxProperties",
)
ALTERNATIVE_KEYWORDS = ("anyOf", "oneOf", "allOf")
# Past this many levels of shared prefixes an enum's values are plain alternatives again.
_TRIE_DEPTH = 64


class Refusal:
    """Builds the errors of one model's limits: each names the limit's key."""

    def __init__(self, limits: StructuredOutputLimits, key: str) -> None:
        self.limits = limits
        self.key = key  # `models.<id>.llamacpp.structured_output`

    def __call__(self, param: str, what: str, limit: str) -> LimitExceededError:
        value = getattr(self.limits, limit)
        return LimitExceededError(
            f"{param}: {what}, past the limit of {value} ({self.key}.{limit})", param=param
        )


def check_schema(schema_text: str, refuse: Refusal, param: str) -> Any:
    """The decoded schema, once it is within the limits that bound its conversion."""
    limits = refuse.limits
    try:
        schema = json.loads(schema_text)
    except (ValueError, RecursionError):
        raise InvalidRequestError(
            f"{param}: the JSON schema is not valid JSON", param=param
        ) from None
    for node, depth in _walk(schema):
        if depth > limits.max_schema_depth:
            raise refuse(
                param, f"the JSON schema is nested {depth} levels deep", "max_schema_depth"
            )
        if isinstance(node, dict):
            _check_node(node, refuse, param)
    size = len(schema_text.encode("utf-8", "surrogatepass"))
    if size > limits.max_schema_bytes:
        raise refuse(param, f"the JSON schema is {size} bytes", "max_schema_bytes")
    return schema


def _walk(schema: Any) -> Iterator[tuple[Any, int]]:
    """Every value of the document with its depth, iteratively (the document may be deep)."""
    pending = [(schema, 1)]
    while pending:
        node, depth = pending.pop()
        yield node, depth
        if isinstance(node, dict):
            pending.extend((value, depth + 1) for value in node.values())
        elif isinstance(node, list):
            pending.extend((value, depth + 1) for value in node)


def _check_node(node: dict[str, Any], refuse: Refusal, param: str) -> None:
    limits = refuse.limits
    enum = node.get("enum")
    if isinstance(enum, list) and len(enum) > limits.max_enum_values:
        raise refuse(param, f"an enum has {len(enum)} values", "max_enum_values")
    properties = node.get("properties")
    if isinstance(properties, dict) and len(properties) > limits.max_properties:
        raise refuse(param, f"an object has {len(properties)} properties", "max_properties")
    for keyword in ALTERNATIVE_KEYWORDS:
        branches = node.get(keyword)
        if isinstance(branches, list) and len(branches) > limits.max_alternatives:
            what = f"an {keyword} has {len(branches)} alternatives"
            raise refuse(param, what, "max_alternatives")
    types = node.get("type")
    if isinstance(types, list) and len(types) > limits.max_alternatives:
        raise refuse(param, f"a type list has {len(types)} types", "max_alternatives")
    for keyword in REPETITION_KEYWORDS:
        value = node.get(keyword)
        if isinstance(value, int | float) and value > limits.max_repetition:
            raise refuse(param, f"{keyword} is {value}", "max_repetition")


def to_gbnf(output: StructuredOutput, refuse: Refusal, param: str) -> str:
    """GBNF for `root ::= (c0 | c1 | ...)` (`+` with repeat), each `"prefix" json "suffix"`."""
    limits = refuse.limits
    if len(output.choices) > limits.max_alternatives:
        raise refuse(
            param, f"a forced call chooses among {len(output.choices)} tools", "max_alternatives"
        )
    schemas = [check_schema(choice.schema, refuse, param) for choice in output.choices]
    total = sum(len(choice.schema.encode("utf-8", "surrogatepass")) for choice in output.choices)
    if total > limits.max_schema_bytes:
        raise refuse(param, f"the tools' JSON schemas are {total} bytes", "max_schema_bytes")
    converter = _Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    choices = []
    with _bounded(_Work(refuse, param, time.monotonic() + limits.compile_seconds)):
        try:
            for index, (segment, schema) in enumerate(zip(output.choices, schemas, strict=True)):
                resolved = converter.resolve_refs(schema, "stdin")
                body = converter.visit(resolved, f"choice{index}-json")
                parts = [_literal(segment.prefix), body, _literal(segment.suffix)]
                choices.append(" ".join(part for part in parts if part))
            rules = converter.format_grammar()
        except _Refused as refused:
            raise refused.error from None
        except Exception as exc:  # the converter raises bare Exceptions, asserts, ValueErrors
            raise InvalidRequestError(
                f"{param}: the JSON schema cannot be turned into a grammar: {exc}", param=param
            ) from None
    alternatives = " | ".join(f"({choice})" for choice in choices)
    root = f"({alternatives})+" if output.repeat else alternatives
    return f"root ::= {root}\n{rules}"


def _literal(text: str) -> str:
    # GBNF string literals take JSON's escapes (\n, \", \uXXXX).
    return json.dumps(text) if text else ""


class _Refused(BaseException):
    """Carries a refusal out of the converter. A BaseException, so that no `except
    Exception` in the converter's code swallows it."""

    def __init__(self, error: LimitExceededError) -> None:
        super().__init__(error)
        self.error = error


class _Work:
    """What one conversion may still do: the bytes of text it may build, and its deadline.

    Checked at each repetition and each rule, the points where the converter's memory and
    time go; between two of them its work is bounded by the schema's size. A repetition's
    text ends up in a rule, so a grammar of `max_grammar_bytes` builds at most twice that.
    """

    def __init__(self, refuse: Refusal, param: str, deadline: float) -> None:
        self._refuse = refuse
        self._param = param
        self._deadline = deadline
        self._left = 2 * refuse.limits.max_grammar_bytes

    def repetition(
        self, item: str, separator: str | None, least: int, most: int | None, literal: bool
    ) -> None:
        """Before the converter writes `item` out `least` to `most` times: the count, and the
        length of the text it would build (llama_grammar._build_repetition's layout)."""
        self.on_time()
        count = max(least, most or 0)
        if count > self._refuse.limits.max_repetition:
            what = (
                f"the schema repeats an item {count} times (a pattern's quantifier, or an "
                "items or length bound)"
            )
            raise _Refused(self._refuse(self._param, what, "max_repetition"))
        joint = len(separator) + 2 if separator else 1
        # Required copies: a literal's text run together, else items joined by separators;
        # optional ones: "(" separator item " " ... ")?" each.
        required = (len(item) - 2 if literal and not separator else len(item) + joint) * least
        optional = (len(item) + joint + 4) * max(0, (most or least) - least)
        self._spend(required + optional + 8)

    def rule(self, name: str, rule: str) -> None:
        """The converter added a rule."""
        self._spend(len(name) + len(rule) + 5)  # "name ::= rule\n"

    def on_time(self) -> None:
        if time.monotonic() > self._deadline:
            what = "turning the JSON schema into a grammar took too long"
            raise _Refused(self._refuse(self._param, what, "compile_seconds"))

    def _spend(self, size: int) -> None:
        self._left -= size
        if self._left < 0:
            what = "the grammar the JSON schema becomes is too large"
            raise _Refused(self._refuse(self._param, what, "max_grammar_bytes"))


# The conversion under way in this thread (or task), if any.
_WORK: ContextVar[_Work | None] = ContextVar("kronk_grammar_work", default=None)


@contextmanager
def _bounded(work: _Work) -> Iterator[None]:
    token = _WORK.set(work)
    try:
        yield
    finally:
        _WORK.reset(token)


_build_repetition = llama_grammar._build_repetition


def _bounded_repetition(
    item_rule: str,
    min_items: int,
    max_items: int | None,
    separator_rule: str | None = None,
    item_rule_is_literal: bool = False,
) -> str:
    """llama-cpp-python's repetition builder, checked first against the conversion's work.
    Every repetition the converter writes comes here with the counts its own parser read,
    so no spelling of a quantifier (`{,N}`, `{+N}`, `{1_000}`) gets past the limit."""
    work = _WORK.get()
    if work is not None:
        work.repetition(item_rule, separator_rule, min_items, max_items, item_rule_is_literal)
    built: str = _build_repetition(
        item_rule, min_items, max_items, separator_rule, item_rule_is_literal
    )
    return built


# The converter calls the module's function by name; outside a bounded conversion the
# replacement does exactly what the original does.
llama_grammar._build_repetition = _bounded_repetition


class _Converter(SchemaConverter):  # type: ignore[misc]
    """llama-cpp-python's converter, with enums written as a tree of shared prefixes and
    each rule checked against the conversion's work."""

    def _add_rule(self, name: str, rule: str) -> str:
        work = _WORK.get()
        if work is not None:
            work.on_time()
        count = len(self._rules)
        key: str = super()._add_rule(name, rule)
        if work is not None and len(self._rules) > count:  # a rule added again is no growth
            work.rule(key, rule)
        return key

    def visit(self, schema: Any, name: str) -> str:
        enum = schema.get("enum") if isinstance(schema, dict) else None
        others = ("$ref", "oneOf", "anyOf", "const")
        if (
            isinstance(enum, list)
            and enum
            and not any(key in schema for key in others)
            and not isinstance(schema.get("type"), list)
        ):
            rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
            texts = sorted({json.dumps(value) for value in enum})
            rule: str = self._add_rule(rule_name, self._prefix_tree(texts, 0))
            return rule
        visited: str = super().visit(schema, name)
        return visited

    def _prefix_tree(self, texts: list[str], depth: int) -> str:
        """One of `texts` (sorted, distinct), alternatives grouped by their shared prefix."""
        if len(texts) == 1:
            return str(self._format_literal(texts[0]))
        if depth >= _TRIE_DEPTH:
            return " | ".join(str(self._format_literal(text)) for text in texts)
        # Sorted: what the first and the last share, all share.
        first, last = texts[0], texts[-1]
        shared = min(len(first), len(last))
        prefix = first[: next((i for i in range(shared) if first[i] != last[i]), shared)]
        rests = [text[len(prefix) :] for text in texts]
        branches = [
            self._prefix_tree(list(group), depth + 1)
            for _, group in itertools.groupby((rest for rest in rests if rest), key=lambda r: r[0])
        ]
        if "" in rests:
            branches.append("")  # a value ends here: the empty alternative
        head = str(self._format_literal(prefix)) + " " if prefix else ""
        return f"{head}({' | '.join(branches)})"
