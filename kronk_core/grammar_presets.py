"""GBNF grammar presets for the `grammar` field: the Kronk manual's `GrammarJSON`,
`GrammarJSONObject`, ... (§9.5), for requests made from Python.

    from kronk_core import grammar_presets
    await kronk.chat(messages, grammar=grammar_presets.JSON_OBJECT, enable_thinking=False)

Whitespace inside JSON is bounded (as llama.cpp's json.gbnf bounds it), so a small model
cannot spend its tokens on blank lines; numbers have at most 16 integer digits.
"""

from __future__ import annotations

_JSON_RULES = r"""
value ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? ws "}"
array ::= "[" ws ( value ("," ws value)* )? ws "]"
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt/] | "u" [0-9a-fA-F]{4}) )* "\""
number ::= "-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,15})?
ws ::= | " " | "\n" [ \t]{0,20}
"""

# A JSON object or array.
JSON = "root ::= object | array" + _JSON_RULES
# A JSON object.
JSON_OBJECT = "root ::= object" + _JSON_RULES
# A JSON array.
JSON_ARRAY = "root ::= array" + _JSON_RULES
# `true` or `false`.
BOOLEAN = 'root ::= "true" | "false"'
# `yes` or `no`.
YES_NO = 'root ::= "yes" | "no"'
# An integer: an optional minus sign and at most 16 digits, no leading zeros.
INTEGER = 'root ::= "-"? ("0" | [1-9] [0-9]{0,15})'
# An integer or a decimal number, with an optional exponent.
NUMBER = 'root ::= "-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?'

# The manual's names.
PRESETS = {
    "GrammarJSON": JSON,
    "GrammarJSONObject": JSON_OBJECT,
    "GrammarJSONArray": JSON_ARRAY,
    "GrammarBoolean": BOOLEAN,
    "GrammarYesNo": YES_NO,
    "GrammarInteger": INTEGER,
    "GrammarNumber": NUMBER,
}
