"""docs/plugins.md's third-party backend (`kronk_echo.py`, "A third-party backend in full")
runs as printed: its files are served by id, loaded by it, through the real engine, cache
strategies, speculative decoding and templates."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest

from kronk_core.contract import ModelFacts
from kronk_testing.plugin import MakeKronk

DOCS = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"
HI = [{"role": "user", "content": "Hi"}]
# Long enough for the cache strategy to keep (`cache_min_tokens`).
HELLO = "Hello from a file. " * 8


@pytest.fixture(scope="module")
def kronk_echo() -> ModuleType:
    """The module the docs print, made from their code block."""
    blocks = re.findall(r"```python\n(# kronk_echo\.py\n.*?)```", DOCS.read_text(), re.DOTALL)
    assert len(blocks) == 1, "docs/plugins.md prints kronk_echo.py once"
    module = ModuleType("kronk_echo")
    exec(compile(blocks[0], "kronk_echo.py", "exec"), module.__dict__)
    return module


async def test_its_files_are_models_it_loads(
    kronk_echo: ModuleType, make_kronk: MakeKronk, tmp_path: Path
) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "hello.echo").write_text(HELLO, encoding="utf-8")
    kronk = make_kronk(plugins={"echo": kronk_echo}, base_path=tmp_path)
    assert "hello" in kronk.models.ids()
    first = await kronk.chat(HI, model="hello")
    assert first.content == HELLO
    assert first.finish_reason == "stop"
    # The cache strategy keeps the conversation: the next turn reuses its prefix.
    messages = [*HI, {"role": "assistant", "content": first.content}, *HI]
    second = await kronk.chat(messages, model="hello")
    assert second.content == HELLO
    assert second.usage.cached_tokens > 0
    assert kronk.models.facts("hello") == ModelFacts("echo", len(HELLO), "bytes", 4096)
    assert kronk.models.memory_estimate("hello") is None


async def test_an_entry_names_it_for_a_file_of_another_kind(
    kronk_echo: ModuleType, make_kronk: MakeKronk, tmp_path: Path
) -> None:
    reply = tmp_path / "reply.txt"
    reply.write_text("Named by its entry.", encoding="utf-8")
    models = {"named": {"backend": "echo", "model_path": str(reply)}}
    kronk = make_kronk(models, plugins={"echo": kronk_echo})
    answer = await kronk.chat(HI, model="named")
    assert answer.content == "Named by its entry."
