"""Turning decoded JSON into calls: which shapes count as a call, and the arguments' text."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kronk_templates.formats.base import CallWriter, Deltas, ParsedCall
from kronk_templates.formats.jsonstream import CompactWriter, Kind, Token

# Keys a call object may carry; anything else means the JSON is not a call.
_CALL_KEYS = frozenset({"name", "arguments", "parameters", "type", "id"})


def compact_json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def arguments_text(value: object) -> str | None:
    """Compact JSON of an arguments object; clients and models may send it as a JSON string."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return compact_json(value) if isinstance(value, dict) else None


def call_from_object(value: object, *, require_arguments: bool) -> ParsedCall | None:
    """`{"name": …, "arguments"|"parameters": {…}}` (optionally `"type": "function"`, `"id"`).

    Bare-JSON formats require the arguments key, so a plain JSON answer that
    happens to have a "name" is not taken for a call.
    """
    if not isinstance(value, dict) or not value.keys() <= _CALL_KEYS:
        return None
    name = value.get("name")
    if not isinstance(name, str) or not name or value.get("type", "function") != "function":
        return None
    raw = value.get("arguments", value.get("parameters"))
    if raw is None and not require_arguments:
        raw = {}
    arguments = arguments_text(raw)
    if arguments is None:
        return None
    call_id = value.get("id")
    return ParsedCall(name, arguments, call_id if isinstance(call_id, str) else None)


def calls_from_values(
    values: list[object] | None, *, require_arguments: bool
) -> list[ParsedCall] | None:
    """Every value a call object or a list of them; None if any is not (all or nothing)."""
    if not values:
        return None
    items = [item for value in values for item in (value if isinstance(value, list) else [value])]
    calls = [call_from_object(item, require_arguments=require_arguments) for item in items]
    if not calls or any(call is None for call in calls):
        return None
    return [call for call in calls if call is not None]


def any_id(call_id: str) -> bool:
    return True


class JsonReader(ABC):
    """Streams the calls in a block's JSON from its tokens, through `writer`.

    A call starts streaming once its name is known and its arguments object
    has begun; from then on it is a call whatever follows: markup that breaks
    after that point ends it, its arguments closed where they stop.
    """

    def __init__(self, writer: CallWriter) -> None:
        self.writer = writer
        self._out = CompactWriter()  # the arguments being written
        self.started = False  # some call of the block started streaming

    @abstractmethod
    def tokens(self, tokens: Sequence[Token], out: Deltas) -> None:
        """The next tokens of the block's JSON."""

    def broken(self, out: Deltas) -> None:
        """The JSON broke: an open call ends here."""
        self._end(out)

    def close(self, out: Deltas) -> None:
        """The block ended (only called once a call started)."""
        self._end(out)

    def _end(self, out: Deltas) -> None:
        if self.writer.open:
            self.writer.arguments(out, self._out.repair())
            self.writer.end(out)


class ArgumentsReader(JsonReader):
    """The JSON is the arguments of a call whose name the markup gave (Harmony, Mistral's [ARGS]).

    No `name`: the markup around the JSON is not a call's, so nothing streams.
    """

    def __init__(self, writer: CallWriter, name: str | None, own_id: str | None = None) -> None:
        super().__init__(writer)
        self._name = name
        self._own_id = own_id
        self._over = name is None

    def tokens(self, tokens: Sequence[Token], out: Deltas) -> None:
        for token in tokens:
            if self._over:
                return
            if not self.started:
                if token.kind is not Kind.OPEN or token.text != "{":
                    self._over = True  # not an object: read whole at the end
                    return
                assert self._name is not None
                self.started = True
                self.writer.start(out, self._name, self._own_id)
            self.writer.arguments(out, self._out.write(token))
            if self._out.done:
                self.writer.end(out)
                self._over = True


@dataclass(slots=True)
class _CallObject:
    """What is known of the call object being read."""

    depth: int  # the depth of its keys
    key: str | None = None
    valid: bool = True
    name: str | None = None
    own_id: str | None = None
    streaming: bool = False
    arguments: list[str] = field(default_factory=list)  # written before the name was known
    in_arguments: bool = False  # the arguments object is open
    has_arguments: bool = False
    text_arguments: str | None = None  # arguments given as a JSON string
    string: list[str] | None = None  # the string value being read at the object's depth


class CallsReader(JsonReader):
    """Call objects (`{"name": …, "arguments": {…}}`), alone or in arrays.

    `require_arguments`: bare-JSON formats, where an object without arguments
    is not a call. `own_id` says which of the model's own ids to keep.
    """

    def __init__(
        self,
        writer: CallWriter,
        *,
        require_arguments: bool,
        own_id: Callable[[str], bool] = any_id,
    ) -> None:
        super().__init__(writer)
        self._require_arguments = require_arguments
        self._keep_id = own_id
        self._depth = 0
        self._call: _CallObject | None = None
        self._waiting: list[ParsedCall] = []  # whole calls not yet written
        self._invalid = False  # something in the block is not a call

    def tokens(self, tokens: Sequence[Token], out: Deltas) -> None:
        for token in tokens:
            self._token(token, out)

    def broken(self, out: Deltas) -> None:
        self._invalid = True
        self._call = None
        super().broken(out)

    def close(self, out: Deltas) -> None:
        super().close(out)
        self._flush(out)

    def _token(self, token: Token, out: Deltas) -> None:
        kind = token.kind
        depth = self._depth
        if kind is Kind.OPEN:
            self._depth += 1
        elif kind is Kind.CLOSE:
            self._depth -= 1
        call = self._call
        if call is None:
            if kind is Kind.OPEN and token.text == "{" and depth <= 1:
                self._call = _CallObject(depth + 1)
            elif kind in (Kind.OPEN, Kind.STRING_START, Kind.SCALAR) and depth > 0:
                self._invalid = True  # not a call object, nor an array of them
            return
        if call.in_arguments:
            text = self._out.write(token)
            if call.streaming:
                self.writer.arguments(out, text)
            else:
                call.arguments.append(text)
            if self._out.done:
                call.in_arguments = False
                if call.streaming:
                    self.writer.end(out)
            return
        if kind is Kind.CLOSE and depth == call.depth:
            self._end_object(call, out)
        elif depth == call.depth:
            self._member(call, token, out)

    def _member(self, call: _CallObject, token: Token, out: Deltas) -> None:
        """A token of the call object itself: a key, or (the start of) a value."""
        kind = token.kind
        if kind is Kind.KEY:
            call.key = token.text
            call.valid = call.valid and token.text in _CALL_KEYS
            return
        key = call.key
        if key in ("arguments", "parameters") and not call.has_arguments:
            call.has_arguments = True
            if kind is Kind.OPEN and token.text == "{":
                self._out = CompactWriter()
                call.in_arguments = True
                call.arguments.append(self._out.write(token))
                self._start(call, out)
                return
            if kind is Kind.SCALAR and token.text == "null":
                call.has_arguments = False
            elif kind is not Kind.STRING_START:
                call.valid = False
        if kind is Kind.STRING_START:
            call.string = []
        elif kind is Kind.STRING and call.string is not None:
            call.string.append(token.text)
        elif kind is Kind.STRING_END and call.string is not None:
            self._string_value(call, key, "".join(call.string))
            call.string = None
            self._start(call, out)
        elif kind in (Kind.OPEN, Kind.SCALAR) and key in ("name", "type"):
            call.valid = False

    def _string_value(self, call: _CallObject, key: str | None, value: str) -> None:
        if key == "name":
            call.name = value or None
            call.valid = call.valid and bool(value)
        elif key == "type":
            call.valid = call.valid and value == "function"
        elif key == "id":
            call.own_id = value if self._keep_id(value) else None
        elif key in ("arguments", "parameters") and call.text_arguments is None:
            call.text_arguments = value

    def _start(self, call: _CallObject, out: Deltas) -> None:
        """Start streaming once the name is known and the arguments object has begun."""
        if call.streaming or not call.arguments or call.name is None:
            return
        if not call.valid or self._invalid or self.writer.open:
            return
        self._flush(out)
        self.started = call.streaming = True
        self.writer.start(out, call.name, call.own_id)
        self.writer.arguments(out, "".join(call.arguments))
        if not call.in_arguments:
            self.writer.end(out)

    def _end_object(self, call: _CallObject, out: Deltas) -> None:
        self._call = None
        if call.streaming:
            return
        whole = self._whole(call)
        if whole is None:
            self._invalid = True
            return
        self._waiting.append(whole)
        if self.started:
            self._flush(out)

    def _whole(self, call: _CallObject) -> ParsedCall | None:
        """A call object that did not stream (its arguments a string, or none)."""
        if not call.valid or call.name is None:
            return None
        if call.arguments:
            arguments: str | None = "".join(call.arguments)
        elif call.text_arguments is not None:
            arguments = arguments_text(call.text_arguments)
        else:
            arguments = None if self._require_arguments else "{}"
        return None if arguments is None else ParsedCall(call.name, arguments, call.own_id)

    def _flush(self, out: Deltas) -> None:
        for call in self._waiting:
            self.writer.whole(out, call)
        self._waiting.clear()
