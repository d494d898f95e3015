"""A model may choose the thread its engine's loop runs on (`HostingModel.engine_thread`,
kronk_core.contract.backend): the llamacpp plugin runs a CPU model's loop on the thread that
computes (plugins/llamacpp/tests/test_compute_thread.py). Here a scripted model hands the
engine a thread of its own making, as a third-party backend would."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from kronk_core.contract import EngineThread, HostingModel
from kronk_core.runtime.engine_thread import OwnThread
from kronk_testing import scripted
from kronk_testing.plugin import ScriptedKronk
from kronk_testing.scripted import ScriptedModel


class RecordingThread(OwnThread):
    """An EngineThread on a thread named "backend-thread", counting its idles and wakes."""

    def __init__(self) -> None:
        super().__init__("backend-thread")
        self.idles = 0
        self.wakes = 0
        self.joined = False

    def idle(self, seconds: float) -> None:
        self.idles += 1
        super().idle(seconds)

    def wake(self) -> None:
        self.wakes += 1
        super().wake()

    def join(self) -> None:
        super().join()
        self.joined = True


@pytest.fixture
def decoded_on(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread each scripted decode ran on."""
    names: list[str] = []
    decode = ScriptedModel.decode

    def recorded(model: ScriptedModel, *args: Any) -> None:
        names.append(threading.current_thread().name)
        decode(model, *args)

    monkeypatch.setattr(ScriptedModel, "decode", recorded)
    return names


def hosting(monkeypatch: pytest.MonkeyPatch, choose: Callable[[str], EngineThread | None]) -> None:
    """The scripted backend loads models that choose their engine's thread with `choose`."""

    class HostedModel(ScriptedModel):
        def engine_thread(self, name: str) -> EngineThread | None:
            return choose(name)

    monkeypatch.setattr(scripted, "ScriptedModel", HostedModel)
    assert issubclass(HostedModel, HostingModel)


async def test_the_engine_runs_its_loop_on_the_thread_the_model_chooses(
    scripted_kronk: ScriptedKronk, decoded_on: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every decode on the chosen thread; each request wakes the idle loop through it;
    unloading joins it."""
    chosen: list[RecordingThread] = []
    names: list[str] = []

    def choose(name: str) -> EngineThread:
        names.append(name)
        chosen.append(RecordingThread())
        return chosen[-1]

    hosting(monkeypatch, choose)
    kronk = scripted_kronk({"m": {"n_seq_max": 1, "cache": "none"}}, load="m")
    (thread,) = chosen
    assert names == ["kronk-engine-m"]
    for _ in range(3):
        result = await kronk.chat([{"role": "user", "content": "ping"}], max_tokens=4)
        assert result.usage.completion_tokens == 4
    assert set(decoded_on) == {"backend-thread"}
    assert thread.wakes >= 3 and thread.idles >= 3
    assert thread.is_alive()
    await kronk.aunload("m")
    assert thread.joined and not thread.is_alive()


async def test_a_model_that_chooses_none_gets_a_thread_of_the_engines_own(
    scripted_kronk: ScriptedKronk, decoded_on: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hosting(monkeypatch, lambda name: None)
    kronk = scripted_kronk({"m": {"n_seq_max": 1, "cache": "none"}}, load="m")
    await kronk.chat([{"role": "user", "content": "ping"}], max_tokens=2)
    assert set(decoded_on) == {"kronk-engine-m"}
