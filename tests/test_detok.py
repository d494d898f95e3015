"""Incremental detokenization: whole UTF-8 characters and exact stop-string cuts."""

from __future__ import annotations

from kronk_core.runtime.detok import StopMatcher, Utf8Stream


def test_three_byte_character_split_across_pushes() -> None:
    data = "日".encode()
    assert len(data) == 3
    stream = Utf8Stream()
    assert stream.push(data[:1]) == ""
    assert stream.push(data[1:2]) == ""
    assert stream.push(data[2:]) == "日"
    assert stream.flush() == ""


def test_split_character_after_ascii_and_four_byte_character() -> None:
    stream = Utf8Stream()
    emoji = "😀".encode()
    assert stream.push(b"ok " + emoji[:2]) == "ok "
    assert stream.push(emoji[2:] + "é".encode()[:1]) == "😀"
    assert stream.push("é".encode()[1:]) == "é"


def test_incomplete_tail_is_replaced_on_flush() -> None:
    stream = Utf8Stream()
    assert stream.push("日".encode()[:2]) == ""
    assert stream.flush() == "\ufffd"


def test_no_stops_passes_text_through() -> None:
    matcher = StopMatcher([])
    assert matcher.push("abc") == "abc"
    assert matcher.flush() == ""
    assert matcher.matched is None


def test_stop_spanning_pushes_returns_text_before_it() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.push("hello S") == "hello "
    assert matcher.push("T") == ""
    assert matcher.push("OP and more") == ""
    assert matcher.matched == "STOP"
    assert matcher.push("later") == ""
    assert matcher.flush() == ""


def test_text_before_stop_in_one_push_is_exact() -> None:
    matcher = StopMatcher(["\n\n"])
    assert matcher.push("line one\n\nline two") == "line one"
    assert matcher.matched == "\n\n"


def test_held_partial_prefix_released_on_flush() -> None:
    matcher = StopMatcher(["</end>"])
    assert matcher.push("value </e") == "value "
    assert matcher.flush() == "</e"
    assert matcher.matched is None


def test_held_partial_prefix_released_when_it_diverges() -> None:
    matcher = StopMatcher(["abc"])
    assert matcher.push("xab") == "x"
    assert matcher.push("x") == "abx"
    assert matcher.push("a") == ""
    assert matcher.push("bc") == ""
    assert matcher.matched == "abc"


def test_earliest_of_two_stops_wins() -> None:
    matcher = StopMatcher(["world", "lo w"])
    assert matcher.push("hello world") == "hel"
    assert matcher.matched == "lo w"

    matcher = StopMatcher(["lo w", "world"])
    assert matcher.push("hello wor") == "hel"
    assert matcher.matched == "lo w"


def test_earliest_stop_across_pushes() -> None:
    matcher = StopMatcher(["BBBB", "AB"])
    assert matcher.push("xxA") == "xx"
    assert matcher.push("BBBB") == ""
    assert matcher.matched == "AB"


def test_empty_stop_strings_are_ignored() -> None:
    matcher = StopMatcher(["", "zz"])
    assert matcher.push("abc") == "abc"
    assert matcher.matched is None
