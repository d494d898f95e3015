"""Grammars compiled off the engine thread, checked against the model's limits, kept by source.

Compiling (schema to GBNF, parsing, building llama.cpp's stacks) happens in
the request's path, in a worker thread; the engine thread only clones the
result. Compiled grammars are kept in a small LRU by what they were compiled
from, so the schema an agent sends with every turn compiles once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import llama_cpp

from kronk_core.contract import (
    CompiledGrammar,
    Grammar,
    InvalidRequestError,
    JsonSchemaGrammar,
    JsonSegment,
    StructuredGrammar,
    StructuredOutput,
)
from kronk_llamacpp.grammar_limits import GbnfSyntaxError, GrammarTooDeepError, measure
from kronk_llamacpp.settings import StructuredOutputLimits
from kronk_llamacpp.structured import Refusal, to_gbnf
from kronk_llamacpp.vocab import utf8

GrammarSource = Grammar | JsonSchemaGrammar | StructuredGrammar


class NativeGrammar:
    """A built llama.cpp grammar sampler that is never advanced: each request gets a clone.

    Freed with its last reference (evicted from the cache and held by no request).
    """

    def __init__(self, pointer: llama_cpp.llama_sampler_p) -> None:
        self._pointer = pointer

    def clone(self) -> llama_cpp.llama_sampler_p:
        return llama_cpp.llama_sampler_clone(self._pointer)

    def __del__(self) -> None:
        llama_cpp.llama_sampler_free(self._pointer)


class GrammarCompiler:
    """One model's compiled grammars. Any thread may call `compile`."""

    def __init__(
        self, vocab: llama_cpp.llama_vocab_p, limits: StructuredOutputLimits, key: str
    ) -> None:
        self._vocab = vocab
        self._refuse = Refusal(limits, key)
        self._cache: OrderedDict[GrammarSource, NativeGrammar] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, source: GrammarSource) -> CompiledGrammar:
        with self._lock:
            native = self._cache.get(source)
            if native is not None:
                self._cache.move_to_end(source)
                return CompiledGrammar(source, native)
        native = self._build(source)
        with self._lock:
            self._cache[source] = native
            while len(self._cache) > self._refuse.limits.cache_entries:
                self._cache.popitem(last=False)
        return CompiledGrammar(source, native)

    @staticmethod
    def clone(compiled: CompiledGrammar) -> llama_cpp.llama_sampler_p:
        """A fresh copy of the compiled grammar for one request's chain."""
        native = compiled.native
        if not isinstance(native, NativeGrammar):
            raise InvalidRequestError(f"a grammar compiled by another backend: {native!r}")
        return native.clone()

    def _build(self, source: GrammarSource) -> NativeGrammar:
        match source:
            case Grammar(gbnf=gbnf, root=root):
                param = "grammar"
                if not gbnf.strip():
                    raise InvalidRequestError(
                        "grammar: an empty grammar constrains nothing; leave it out instead",
                        param=param,
                    )
            case JsonSchemaGrammar(schema=schema):
                param, root = "json_schema", "root"
                gbnf = to_gbnf(StructuredOutput((JsonSegment(schema),)), self._refuse, param)
            case StructuredGrammar(output=output):
                param, root = "tools", "root"
                gbnf = to_gbnf(output, self._refuse, param)
        self._check(gbnf, root, param)
        pointer = llama_cpp.llama_sampler_init_grammar(
            self._vocab, utf8(gbnf, param), utf8(root, param)
        )
        if not pointer:
            raise InvalidRequestError(f"{param}: the GBNF grammar does not parse", param=param)
        return NativeGrammar(pointer)

    def _check(self, gbnf: str, root: str, param: str) -> None:
        """What would crash llama.cpp or stall the engine is refused before llama.cpp sees it."""
        limits, refuse = self._refuse.limits, self._refuse
        size = len(utf8(gbnf, param))
        if size > limits.max_grammar_bytes:
            raise refuse(param, f"the grammar is {size} bytes", "max_grammar_bytes")
        try:
            shape = measure(gbnf, root, limits.max_grammar_depth, limits.max_grammar_branches + 1)
        except GrammarTooDeepError as exc:
            raise refuse(param, f"the grammar has {exc}", "max_grammar_depth") from None
        except GbnfSyntaxError as exc:
            raise InvalidRequestError(
                f"{param}: the GBNF grammar does not parse: {exc}", param=param
            ) from None
        if shape.depth > limits.max_grammar_depth:
            what = f"the grammar nests {shape.depth} rules deep"
            raise refuse(param, what, "max_grammar_depth")
        if shape.branches > limits.max_grammar_branches:
            what = "the grammar opens too many branches at one point (each sampled token is "
            what += "checked against every open branch)"
            raise refuse(param, what, "max_grammar_branches")
