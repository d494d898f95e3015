"""Pieces of GBNF grammars (llama.cpp's grammar syntax) for formats that are not one JSON value."""

from __future__ import annotations

import json

# Any JSON value, for parameters whose schema is not a plain type.
JSON_RULES = r"""
json-value ::= json-object | json-array | json-string | json-number | "true" | "false" | "null"
json-object ::= "{" json-ws ( json-member ( "," json-ws json-member )* )? "}"
json-member ::= json-string json-ws ":" json-ws json-value json-ws
json-array ::= "[" json-ws ( json-value json-ws ( "," json-ws json-value json-ws )* )? "]"
json-string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" json-escape )* "\""
json-escape ::= ["\\/bfnrt] | "u" json-hex json-hex json-hex json-hex
json-hex ::= [0-9a-fA-F]
json-number ::= json-int ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
json-int ::= "-"? ( "0" | [1-9] [0-9]* )
json-ws ::= [ \t\n]*
""".strip()


def literal(text: str) -> str:
    """A GBNF string literal matching `text` exactly."""
    return json.dumps(text, ensure_ascii=False)


def _char(char: str) -> str:
    return (
        char
        if char.isalnum()
        else f"\\x{ord(char):02X}"
        if ord(char) < 0x80
        else f"\\u{ord(char):04X}"
    )


def excluding(name: str, word: str) -> str:
    """Rules `name-0…` for any text that does not contain `word`; `name-0` is the entry.

    A state machine on how much of `word` the text ends with; it needs the
    first character of `word` not to appear again in it (true of closing tags).
    """
    first = word[0]
    assert first not in word[1:]
    rules = []
    for done in range(len(word)):
        alternatives = ['""', f"{literal(first)} {name}-1"]
        if done == 0:
            alternatives.append(f"[^{_char(first)}] {name}-0")
        else:
            following = word[done]
            alternatives.append(f"[^{_char(first)}{_char(following)}] {name}-0")
            if done + 1 < len(word):
                alternatives.append(f"{literal(following)} {name}-{done + 1}")
        rules.append(f"{name}-{done} ::= {' | '.join(alternatives)}")
    return "\n".join(rules)
