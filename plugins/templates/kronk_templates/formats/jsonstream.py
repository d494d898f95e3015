"""Reading JSON as it arrives: tokens, and the compact text of a value written as it goes.

A tool call's arguments stream while the model writes them, as the compact JSON
that `compact_json` makes of the whole value (`json.dumps` with no spaces,
`ensure_ascii` off), so the fragments of a call add up to its `arguments`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum, auto

_PLAIN = re.compile(r'[^"\\\x00-\x1f]+')
_SCALAR = re.compile(r"[-+.0-9A-Za-z]+")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = frozenset("0123456789abcdefABCDEF")


class JsonBroken(Exception):
    """The text is not JSON."""


class Kind(Enum):
    OPEN = auto()  # `{` or `[`
    CLOSE = auto()  # `}` or `]`
    COMMA = auto()
    KEY = auto()  # a whole object key, decoded
    STRING_START = auto()
    STRING = auto()  # a piece of a string value, decoded
    STRING_END = auto()
    SCALAR = auto()  # a number or literal, as compact JSON


@dataclass(frozen=True, slots=True)
class Token:
    kind: Kind
    text: str = ""


class _Expect(Enum):
    VALUE = auto()
    FIRST_VALUE = auto()  # after `[`: a value or `]`
    FIRST_KEY = auto()  # after `{`: a key or `}`
    KEY = auto()
    COLON = auto()
    AFTER = auto()  # after a value: `,` or the closing bracket


class JsonLexer:
    """Tokens of one JSON object or array, validated as they come; stops at its end.

    Strings are decoded (escapes, surrogate pairs); numbers and literals come
    whole once the character after them arrives.
    """

    def __init__(self) -> None:
        self._stack: list[str] = []
        self._expect = _Expect.VALUE
        self._mode: Kind | None = None  # KEY, STRING_START (in a value string), SCALAR
        self._text: list[str] = []  # the key, string piece or scalar being read
        self._escape: str | None = None  # an escape sequence after its backslash, unfinished
        self._high: str | None = None  # a high surrogate waiting for its pair
        self.done = False
        self.broken = False

    def feed(self, text: str) -> list[Token]:
        """The tokens in `text` up to the value's end (`done`), or up to the first character
        that JSON does not allow there (`broken`; nothing is read after it)."""
        tokens: list[Token] = []
        try:
            self._feed(text, tokens)
        except JsonBroken:
            self.broken = True
        return tokens

    def _feed(self, text: str, tokens: list[Token]) -> None:
        at = 0
        while at < len(text) and not (self.done or self.broken):
            if self._mode is None:
                at = self._structure(text, at, tokens)
            elif self._mode is Kind.SCALAR:
                match = _SCALAR.match(text, at)
                if match is None:
                    self._end_scalar(tokens)
                else:
                    self._text.append(match.group())
                    at = match.end()
            else:
                at = self._string(text, at, tokens)
        if self._mode is Kind.STRING_START:
            self._flush_piece(tokens)

    def _structure(self, text: str, at: int, tokens: list[Token]) -> int:
        char = text[at]
        expect = self._expect
        if char in " \t\r\n":
            return at + 1
        if expect in (_Expect.VALUE, _Expect.FIRST_VALUE) and char in "{[":
            self._stack.append(char)
            self._expect = _Expect.FIRST_KEY if char == "{" else _Expect.FIRST_VALUE
            tokens.append(Token(Kind.OPEN, char))
        elif not self._stack:
            raise JsonBroken(char)  # a tool call is an object or an array
        elif expect in (_Expect.VALUE, _Expect.FIRST_VALUE) and char == '"':
            self._mode = Kind.STRING_START
            tokens.append(Token(Kind.STRING_START))
        elif expect in (_Expect.VALUE, _Expect.FIRST_VALUE) and _SCALAR.match(char):
            self._mode = Kind.SCALAR
            return at  # the scalar's first character is read with the rest
        elif expect in (_Expect.FIRST_KEY, _Expect.KEY) and char == '"':
            self._mode = Kind.KEY
        elif expect is _Expect.COLON and char == ":":
            self._expect = _Expect.VALUE
        elif expect is _Expect.AFTER and char == ",":
            self._expect = _Expect.KEY if self._stack[-1] == "{" else _Expect.VALUE
            tokens.append(Token(Kind.COMMA))
        elif (
            expect in (_Expect.AFTER, _Expect.FIRST_KEY, _Expect.FIRST_VALUE)
            and char in "}]"
            and "{[".index(self._stack[-1]) == "}]".index(char)
        ):
            self._stack.pop()
            self._expect = _Expect.AFTER
            self.done = not self._stack
            tokens.append(Token(Kind.CLOSE, char))
        else:
            raise JsonBroken(char)
        return at + 1

    def _end_scalar(self, tokens: list[Token]) -> None:
        text = "".join(self._text)
        self._text, self._mode = [], None
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            raise JsonBroken(text) from None
        if isinstance(value, str | list | dict):
            raise JsonBroken(text)
        tokens.append(Token(Kind.SCALAR, json.dumps(value)))
        self._expect = _Expect.AFTER

    def _string(self, text: str, at: int, tokens: list[Token]) -> int:
        if self._escape is not None:
            return self._escaped(text, at)
        match = _PLAIN.match(text, at)
        if match is not None:
            self._char(match.group())
            return match.end()
        char = text[at]
        if char == "\\":
            self._escape = ""
        elif char == '"':
            self._char("")
            if self._mode is Kind.KEY:
                tokens.append(Token(Kind.KEY, "".join(self._text)))
                self._text = []
                self._expect = _Expect.COLON
            else:
                self._flush_piece(tokens)
                tokens.append(Token(Kind.STRING_END))
                self._expect = _Expect.AFTER
            self._mode = None
        else:
            raise JsonBroken(char)  # a raw control character
        return at + 1

    def _escaped(self, text: str, at: int) -> int:
        assert self._escape is not None
        char = text[at]
        if not self._escape:
            if char in _ESCAPES:
                self._escape = None
                self._char(_ESCAPES[char])
            elif char == "u":
                self._escape = "u"
            else:
                raise JsonBroken(char)
            return at + 1
        if char not in _HEX:
            raise JsonBroken(char)
        self._escape += char
        if len(self._escape) == 5:
            code = int(self._escape[1:], 16)
            self._escape = None
            if self._high is not None and 0xDC00 <= code < 0xE000:
                pair = 0x10000 + ((ord(self._high) - 0xD800) << 10) + code - 0xDC00
                self._high = None
                self._char(chr(pair))
            elif 0xD800 <= code < 0xDC00:
                self._char("")
                self._high = chr(code)
            else:
                self._char(chr(code))
        return at + 1

    def _char(self, text: str) -> None:
        """Decoded string text; a lone high surrogate before it is kept as it is (as json does)."""
        if self._high is not None:
            self._text.append(self._high)
            self._high = None
        self._text.append(text)

    def _flush_piece(self, tokens: list[Token]) -> None:
        piece = "".join(self._text)
        self._text = []
        if piece:
            tokens.append(Token(Kind.STRING, piece))


def string_body(text: str) -> str:
    """`text` as the inside of a compact JSON string."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


class CompactWriter:
    """The compact JSON of one value, from its tokens; `repair` closes what is still open.

    A separator and a key are written with the value after them, so the text
    written so far always closes into valid JSON.
    """

    def __init__(self) -> None:
        self._stack: list[str] = []
        self._comma = False
        self._key: str | None = None
        self._in_string = False

    @property
    def done(self) -> bool:
        return not self._stack and not self._in_string

    def write(self, token: Token) -> str:
        kind = token.kind
        if kind is Kind.COMMA:
            self._comma = True
            return ""
        if kind is Kind.KEY:
            self._key = token.text
            return ""
        if kind is Kind.STRING:
            return string_body(token.text)
        if kind is Kind.STRING_END:
            self._in_string = False
            return '"'
        if kind is Kind.CLOSE:
            self._stack.pop()
            return token.text
        head = "," if self._comma else ""
        if self._key is not None:
            head += json.dumps(self._key, ensure_ascii=False) + ":"
        self._comma, self._key = False, None
        if kind is Kind.OPEN:
            self._stack.append("}" if token.text == "{" else "]")
            return head + token.text
        if kind is Kind.STRING_START:
            self._in_string = True
            return head + '"'
        return head + token.text

    def repair(self) -> str:
        """What makes the text written so far a whole value (a key without a value is left out)."""
        return ('"' if self._in_string else "") + "".join(reversed(self._stack))
