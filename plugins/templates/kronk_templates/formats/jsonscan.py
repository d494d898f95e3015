"""Where a JSON object or array ends, found as its text arrives in pieces."""

from __future__ import annotations

import json
import re

_OUTSIDE = re.compile(r'["{}\[\]]')
_INSIDE = re.compile(r'["\\]')
_DECODER = json.JSONDecoder()


class JsonScanner:
    """Tracks strings, escapes and nesting; does not validate (json.loads does that later)."""

    def __init__(self) -> None:
        self._started = False
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def feed(self, text: str) -> int | None:
        """The index in `text` just past the value's end, or None while it goes on.

        Leading whitespace is skipped; a value that does not open with `{` or `[`
        ends before its first character (the caller finds it malformed).
        """
        at = 0
        if not self._started:
            at = len(text) - len(text.lstrip())
            if at == len(text):
                return None
            if text[at] not in "{[":
                return at
            self._started = True
        while at < len(text):
            if self._escaped:
                self._escaped = False
                at += 1
            elif self._in_string:
                match = _INSIDE.search(text, at)
                if match is None:
                    return None
                at = match.end()
                self._escaped = match.group() == "\\"
                self._in_string = self._escaped
            else:
                match = _OUTSIDE.search(text, at)
                if match is None:
                    return None
                at = match.end()
                char = match.group()
                if char == '"':
                    self._in_string = True
                elif char in "{[":
                    self._depth += 1
                else:
                    self._depth -= 1
                    if self._depth == 0:
                        return at
        return None


def json_values(text: str, gap: str = " \t\r\n") -> list[object] | None:
    """The JSON values in `text`, one after another with only `gap` characters around them.

    None when anything else is there, or nothing at all.
    """
    values: list[object] = []
    at = 0
    while True:
        while at < len(text) and text[at] in gap:
            at += 1
        if at == len(text):
            return values or None
        try:
            value, at = _DECODER.raw_decode(text, at)
        except json.JSONDecodeError:
            return None
        values.append(value)
