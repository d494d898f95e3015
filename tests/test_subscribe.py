"""KronkView.subscribe: an observer's hookimpls run while it is subscribed, and only then."""

from __future__ import annotations

from pathlib import Path

from kronk_core import Kronk, KronkConfig, hookimpl
from kronk_core.contract import ChatRecord, KronkView, Usage


class Finished:
    def __init__(self) -> None:
        self.seen: list[str] = []

    @hookimpl
    def kronk_chat_finished(self, record: ChatRecord) -> None:
        self.seen.append(record.request_id)


def _finish(kronk: Kronk, request_id: str) -> None:
    record = ChatRecord(request_id, "m", 0.0, 0.0, 0.0, 0.0, "stop", Usage())
    kronk.hook.kronk_chat_finished(record=record)


def test_an_observer_hears_the_hook_calls_until_its_subscription_is_cancelled(
    tmp_path: Path,
) -> None:
    kronk = Kronk(KronkConfig(base_path=tmp_path))
    view: KronkView = kronk
    observer = Finished()
    _finish(kronk, "before")
    subscription = view.subscribe(observer)
    _finish(kronk, "during")
    subscription.cancel()
    subscription.cancel()  # again: nothing more to do
    _finish(kronk, "after")
    assert observer.seen == ["during"]


def test_a_subscription_held_in_a_with_block_ends_with_it(tmp_path: Path) -> None:
    kronk = Kronk(KronkConfig(base_path=tmp_path))
    observer = Finished()
    with kronk.subscribe(observer):
        _finish(kronk, "inside")
    _finish(kronk, "outside")
    # Subscribed again once the first subscription ended.
    with kronk.subscribe(observer):
        _finish(kronk, "again")
    assert observer.seen == ["inside", "again"]
