"""Turning decoded JSON into calls: which shapes count as a call, and the arguments' text."""

from __future__ import annotations

import json

from kronk_templates.formats.base import ParsedCall

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
