"""The plugin manager: installed entry points, selection by environment, in-process plugins."""

from __future__ import annotations

from pathlib import Path

import pytest

from kronk_core import Kronk, KronkConfig, hookimpl
from kronk_core.contract.backend import ModelInfo
from kronk_core.contract.plugins import create_plugin_manager, registered_plugins
from kronk_core.contract.sampling import Greedy, SamplerStage
from kronk_core.contract.selection import PluginSelection
from kronk_core.contract.types import SamplingParams
from kronk_core.settings.config import ModelConfig
from kronk_llamacpp.packaged import GEMMA_MODEL_ID, GEMMA_MODEL_SETTINGS

BUILT_IN = {"caching", "llamacpp", "sampling", "templates", "openai", "anthropic"}


@pytest.fixture(autouse=True)
def _clean_plugin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KRONK_PLUGINS", raising=False)
    monkeypatch.delenv("KRONK_DISABLE_PLUGINS", raising=False)


def test_installed_entry_points_are_registered() -> None:
    names = set(registered_plugins(create_plugin_manager()))
    assert names >= BUILT_IN


def test_disable_plugins_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KRONK_DISABLE_PLUGINS", "sampling")
    names = set(registered_plugins(create_plugin_manager()))
    assert "sampling" not in names
    assert names >= BUILT_IN - {"sampling"}


def test_enable_only_named_plugins_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KRONK_PLUGINS", "templates")
    assert registered_plugins(create_plugin_manager()) == ["templates"]


def test_environment_overrides_config_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    selection = PluginSelection(enabled=["caching", "sampling"])
    assert set(registered_plugins(create_plugin_manager(selection))) == {"caching", "sampling"}
    monkeypatch.setenv("KRONK_PLUGINS", "llamacpp")
    assert registered_plugins(create_plugin_manager(selection)) == ["llamacpp"]


def test_selection_applies_to_in_process_plugins() -> None:
    class Extra:
        pass

    selection = PluginSelection(disabled=["mine"])
    names = registered_plugins(create_plugin_manager(selection, extra={"mine": Extra()}))
    assert "mine" not in names
    names = registered_plugins(create_plugin_manager(extra={"mine": Extra()}))
    assert "mine" in names


class GreedyOnly:
    """A third-party sampler plugin: always greedy, whatever the request asks for."""

    def __init__(self) -> None:
        self.calls: list[SamplingParams] = []

    @hookimpl(tryfirst=True)
    def kronk_sampler_stages(
        self, params: SamplingParams, model_info: ModelInfo
    ) -> list[SamplerStage]:
        self.calls.append(params)
        return [Greedy()]


async def test_in_process_sampler_plugin_is_consulted_first(kronk: Kronk, tmp_path: Path) -> None:
    plugin = GreedyOnly()
    config = KronkConfig(
        base_path=tmp_path,
        default_model=GEMMA_MODEL_ID,
        models={GEMMA_MODEL_ID: ModelConfig.model_validate(GEMMA_MODEL_SETTINGS)},
    )
    mine = Kronk(config, plugins={"mine": plugin})
    try:
        assert "mine" in registered_plugins(mine.plugins)
        assert mine.hook.kronk_sampler_stages(
            params=SamplingParams(temperature=0.9), model_info=None
        ) == [Greedy()]
        messages = [{"role": "user", "content": "Python is a programming language."}]
        hot = await mine.chat(messages, temperature=0.9, max_tokens=12)
        assert plugin.calls and plugin.calls[-1].temperature == 0.9
        # The same model without the plugin, truly greedy (no DRY stage either).
        reference = await kronk.chat(messages, temperature=0, dry_multiplier=0, max_tokens=12)
        assert hot.content == reference.content
        assert hot.usage.completion_tokens == reference.usage.completion_tokens
    finally:
        mine.close()
    assert mine.get_loaded() is None
