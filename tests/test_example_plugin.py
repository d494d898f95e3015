"""The third-party plugin in examples/, installed by the tests session, works like a built-in.

Its cache strategy is selected by name from a model-config YAML file, its
route is served with its own settings section from a settings YAML file, and
`kronk plugins`, the flags and the error messages treat it as they treat the
built-ins.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from kronk_api import create_app
from kronk_api.settings import load_settings
from kronk_core import Kronk, KronkConfig
from kronk_core.contract.errors import ConfigError
from kronk_core.settings.config import load_model_config_file

if TYPE_CHECKING:
    from kronk_testing.server import Serve

CLI = [sys.executable, "-m", "kronk_api.cli"]
TURNS = [
    "Tell me about the port engine of the research vessel Kestrel, and its last repair.",
    "And the starboard engine? Compare the two, please, with every figure you know.",
]


def kronk_command(*args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("KRONK_")}
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_it_is_installed_as_a_distribution_with_its_entry_point() -> None:
    listed = kronk_command("plugins", "--json")
    assert listed.returncode == 0, listed.stderr
    example = {entry["name"]: entry for entry in json.loads(listed.stdout)}["example"]
    assert example == {
        "name": "example",
        "distribution": "kronk-example-plugin 0.1.0",
        "active": True,
        "hooks": ["kronk_app", "kronk_register_cache_strategies", "kronk_settings"],
        "registered": {"cache_strategies": ["extend-only"]},
        "settings": {"server": ["example"], "model": ["example"]},
    }


def test_its_server_setting_has_a_flag_and_a_variable_by_the_rule() -> None:
    help_text = kronk_command("server", "start", "--help").stdout
    assert "--example-greeting TEXT" in help_text
    assert "KRONK_EXAMPLE_GREETING" in help_text


@pytest.fixture(scope="module")
def example(
    gemma_path: str, tmp_path_factory: pytest.TempPathFactory, serve: Serve
) -> Iterator[tuple[Kronk, str]]:
    """A server whose model takes `cache: extend-only` and whose settings greet, from YAML."""
    home = tmp_path_factory.mktemp("example-plugin")
    models = home / "models.yaml"
    models.write_text(
        "models:\n"
        "  agent:\n"
        f"    model_path: {gemma_path}\n"
        "    context_window: 2048\n"
        "    n_seq_max: 2\n"
        "    cache: extend-only\n"
        "    sampling: {dry_multiplier: 0}\n"
        "    example:\n"
        "      min_tokens: 8\n"
        "  cold:\n"
        f"    model_path: {gemma_path}\n"
        "    context_window: 2048\n"
        "    sampling: {dry_multiplier: 0}\n",
        encoding="utf-8",
    )
    server = home / "server.yaml"
    server.write_text(
        f"base_path: {home}\nmodel_config_file: {models}\nexample:\n  greeting: ahoy\n",
        encoding="utf-8",
    )
    settings = load_settings(server, {})
    kronk = Kronk(settings.kronk_config())
    with serve(create_app(settings, kronk=kronk)) as base_url:
        yield kronk, base_url


def test_its_route_answers_from_its_settings_section(example: tuple[Kronk, str]) -> None:
    _, base_url = example
    response = httpx.get(f"{base_url}/v1/example/greeting", timeout=30)
    assert response.status_code == 200, response.text
    assert response.json() == {"greeting": "ahoy"}


def test_its_cache_strategy_reuses_a_conversation_exactly(example: tuple[Kronk, str]) -> None:
    kronk, base_url = example

    def chat(model: str, messages: list[dict[str, str]]) -> dict[str, object]:
        body = {"model": model, "messages": messages, "max_tokens": 16, "temperature": 0}
        response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        answer: dict[str, object] = response.json()
        return answer

    first_messages = [{"role": "user", "content": TURNS[0]}]
    first = chat("agent", first_messages)
    reply = first["choices"][0]["message"]["content"]  # type: ignore[index]
    second_messages = [
        *first_messages,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": TURNS[1]},
    ]
    second = chat("agent", second_messages)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]  # type: ignore[index]
    assert cached >= first["usage"]["prompt_tokens"]  # type: ignore[index]
    # The same greedy answer as a model that caches nothing.
    cold = chat("cold", second_messages)
    assert second["choices"] == cold["choices"]
    slots = httpx.get(f"{base_url}/v1/kronk/slots", timeout=30).json()["data"]
    agent = {entry["model"]: entry for entry in slots}["agent"]
    assert agent["cache"] == "extend-only"
    assert agent["counters"]["hits"] == 1 and agent["counters"]["tokens_saved"] == cached
    loaded = kronk.get_loaded("agent")
    assert loaded is not None and loaded.cache.name == "extend-only"


def test_its_model_settings_are_checked_like_a_built_in_s(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  m1:\n    example:\n      min_tokens: 0\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        Kronk(KronkConfig(base_path=tmp_path, models=load_model_config_file(path)))
    assert str(info.value) == (
        "models.m1.example.min_tokens: Input should be greater than or equal to 1"
    )
