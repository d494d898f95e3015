"""How a stream of chat deltas must carry tool calls, for tests of output parsers."""

from __future__ import annotations

from kronk_core.contract import ChatDelta, ToolCallDelta


def check_streamed_calls(deltas: list[ChatDelta]) -> None:
    """Each call streams before it arrives whole: a head with its name, then fragments that
    add up to its arguments; one call at a time."""
    open_call: ToolCallDelta | None = None
    fragments: list[str] = []
    for delta in deltas:
        for piece in delta.tool_call_deltas:
            if open_call is None:
                assert piece.name, piece
                open_call, fragments = piece, []
            else:
                assert piece.id == open_call.id and piece.name is None, piece
            fragments.append(piece.arguments)
        for call in delta.tool_calls:
            assert open_call is not None and call.id == open_call.id, call
            assert call.name == open_call.name
            assert "".join(fragments) == call.arguments
            open_call = None
        if delta.content or delta.reasoning:
            assert open_call is None, delta
    assert open_call is None
