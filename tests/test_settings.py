"""Plugin-owned settings: sections validated by their plugins, errors that name the key."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jwt
import pytest
from click.testing import CliRunner
from pydantic import BaseModel, ConfigDict, Field

from kronk_api import ServerSettings, create_app
from kronk_api.cli import main
from kronk_api.settings import all_settings, server_sections
from kronk_caching.plugin import no_cache
from kronk_core import Kronk, KronkConfig, ModelConfig, hookimpl
from kronk_core.contract.cache import CacheStrategyFactory
from kronk_core.contract.errors import ConfigError
from kronk_core.contract.registry import Register
from kronk_core.contract.selection import PluginSelection
from kronk_core.settings.config import load_model_config_file
from kronk_core.settings.sections import ModelSection, Section, ServerSection
from kronk_llamacpp.settings import SETTINGS as LLAMACPP
from kronk_llamacpp.settings import CacheType


def bound(tmp_path: Path, entry: dict[str, Any], **kronk: Any) -> ModelConfig:
    """The entry `m1` as a Kronk built on it sees it (every section validated)."""
    config = KronkConfig(base_path=tmp_path, models={"m1": ModelConfig.model_validate(entry)})
    instance = Kronk(config, **kronk)
    try:
        return instance.config.models["m1"]
    finally:
        instance.close()


def refused(tmp_path: Path, entry: dict[str, Any], **kronk: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        bound(tmp_path, entry, **kronk)
    return info.value


def test_a_plugin_section_is_validated_by_its_plugin(tmp_path: Path) -> None:
    config = bound(tmp_path, {"llamacpp": {"cache_type_k": "Q8_0", "n_threads": 2}})
    llamacpp = LLAMACPP.of(config)
    assert llamacpp.cache_type_k is CacheType.q8_0  # case-insensitive
    assert llamacpp.cache_type_v is CacheType.f16 and llamacpp.n_threads == 2
    # A section that is not written is there with its defaults, for every active plugin.
    assert set(config.sections) >= {"llamacpp", "caching", "templates"}
    assert config.sections["caching"].cache_min_tokens == 100


@pytest.mark.parametrize(
    ("entry", "key", "words"),
    [
        ({"llamacpp": {"cache_type_k": "q3_x"}}, "models.m1.llamacpp.cache_type_k", "'q8_0'"),
        ({"caching": {"cache_min_tokens": -1}}, "models.m1.caching.cache_min_tokens", "0"),
        ({"templates": {"bogus": 1}}, "models.m1.templates.bogus", "Extra inputs"),
        # A check across keys: the section's n_ubatch against the core's n_batch.
        ({"n_batch": 256, "llamacpp": {"n_ubatch": 512}}, "models.m1.llamacpp.n_ubatch", "256"),
        ({"lookahead": {"ndraft": 4}}, "models.m1.lookahead", "is not installed"),
    ],
    ids=["enum", "range", "unknown-key", "cross-key", "unknown-section"],
)
def test_errors_name_the_key(tmp_path: Path, entry: dict[str, Any], key: str, words: str) -> None:
    error = refused(tmp_path, entry)
    assert error.key == key
    assert str(error).startswith(f"{key}: ") and words in str(error)


def test_a_disabled_plugin_s_section_is_refused(tmp_path: Path) -> None:
    config = KronkConfig(
        base_path=tmp_path,
        plugins=PluginSelection(disabled=["caching"]),
        models={"m1": ModelConfig.model_validate({"caching": {"host_cache_bytes": 0}})},
    )
    with pytest.raises(ConfigError) as info:
        Kronk(config)
    assert info.value.key == "models.m1.caching"
    assert "a plugin named 'caching' is disabled" in str(info.value)


def test_the_manual_s_model_keys_reach_the_plugin_sections(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(
        "models:\n  m1:\n    incremental_cache: true\n    swa_full: false\n    n_ubatch: 256\n",
        encoding="utf-8",
    )
    with caplog.at_level(logging.WARNING, logger="kronk_core.settings.sections"):
        models = load_model_config_file(path)
        config = bound(tmp_path, models["m1"].model_dump())
    assert config.cache == "imc"
    assert LLAMACPP.of(config).swa_full is False and LLAMACPP.of(config).n_ubatch == 256
    assert "deprecated" not in caplog.text


# ---- a third party's sections ---------------------------------------------------------


class Draft(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ndraft: int = Field(default=4, ge=1)


class Greeting(BaseModel):
    model_config = ConfigDict(extra="forbid")

    greeting: str = Field(default="hello", description="What the probe says")
    loud: bool = Field(default=False, description="Shout it")


DRAFT = ModelSection("lookahead", Draft)
GREETING = ServerSection("lookahead", Greeting)


class Lookahead:
    @hookimpl
    def kronk_settings(self) -> list[Section[Any]]:
        return [DRAFT, GREETING]


def test_a_third_party_section_is_validated_like_a_built_in(tmp_path: Path) -> None:
    plugins = {"lookahead": Lookahead()}
    config = bound(tmp_path, {"lookahead": {"ndraft": 8}}, plugins=plugins)
    assert DRAFT.of(config) == Draft(ndraft=8)
    error = refused(tmp_path, {"lookahead": {"ndraft": 0}}, plugins=plugins)
    assert error.key == "models.m1.lookahead.ndraft"
    assert str(error) == "models.m1.lookahead.ndraft: Input should be greater than or equal to 1"


def test_a_third_party_server_section_gets_flags_and_variables(tmp_path: Path) -> None:
    kronk = Kronk(KronkConfig(base_path=tmp_path), plugins={"lookahead": Lookahead()})
    names = {(s.key, s.flag, s.env) for s in all_settings(server_sections(kronk.plugins))}
    assert ("lookahead.greeting", "--lookahead-greeting", "KRONK_LOOKAHEAD_GREETING") in names
    assert ("lookahead.loud", "--lookahead-loud", "KRONK_LOOKAHEAD_LOUD") in names
    app = create_app(ServerSettings(sections={"lookahead": {"greeting": "hi"}}), kronk=kronk)
    assert GREETING.of(app.state.settings) == Greeting(greeting="hi")
    with pytest.raises(ConfigError) as info:
        create_app(ServerSettings(sections={"lookahead": {"loud": "maybe"}}), kronk=kronk)
    assert info.value.key == "lookahead.loud"
    kronk.close()


def test_two_plugins_may_not_declare_one_section(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        Kronk(
            KronkConfig(base_path=tmp_path),
            plugins={"lookahead": Lookahead(), "copycat": Lookahead()},
        )
    assert "declared by both plugins" in str(info.value)


def test_a_server_section_s_bad_value_names_its_key(tmp_path: Path) -> None:
    kronk = Kronk(KronkConfig(base_path=tmp_path))
    settings = ServerSettings(sections={"auth-jwt": {"enabled": "maybe"}})
    with pytest.raises(ConfigError) as info:
        create_app(settings, kronk=kronk)
    assert info.value.key == "auth-jwt.enabled"
    kronk.close()


def test_the_security_cli_reads_the_settings_names_and_the_deprecated_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def issuer(*options: str, env: dict[str, str] | None = None) -> str:
        arguments = ["security", "token", "create", "--local", "--base-path", str(tmp_path)]
        arguments += ["--duration", "1h", "--endpoints", "tokenize", *options]
        result = CliRunner().invoke(main, arguments, env=env)
        assert result.exit_code == 0, result.output
        claims = jwt.decode(result.output.strip(), options={"verify_signature": False})
        value: str = claims["iss"]
        return value

    with caplog.at_level(logging.WARNING, logger="kronk_core.settings.sections"):
        assert issuer() == "kronk"
        assert issuer("--auth-jwt-issuer", "acme") == "acme"
        assert issuer(env={"KRONK_AUTH_JWT_ISSUER": "from-env"}) == "from-env"
        assert issuer("--auth-issuer", "manual-flag") == "manual-flag"
        assert issuer(env={"KRONK_AUTH_ISSUER": "manual-env"}) == "manual-env"
        # The manual's settings table names the local issuer's variable so too.
        assert issuer(env={"KRONK_AUTH_LOCAL_ISSUER": "manual-table"}) == "manual-table"
        assert issuer("--auth-issuer", "a", "--auth-jwt-issuer", "b") == "b"
    assert "deprecated" not in caplog.text  # the manual's spellings


@pytest.mark.parametrize(
    ("entry", "key", "registered"),
    [
        ({"cache": "lru"}, "models.m.cache", "imc, none, spc"),
        ({"template_processor": "mustache"}, "models.m.template_processor", "jinja"),
        ({"templates": {"tool_format": "smoke"}}, "models.m.templates.tool_format", "gemma, "),
    ],
    ids=["cache", "template-processor", "tool-format"],
)
def test_a_name_no_plugin_registers_fails_the_load(
    tmp_path: Path, tiny_llama_path: Path, entry: dict[str, Any], key: str, registered: str
) -> None:
    model = ModelConfig.model_validate(
        {"model_path": tiny_llama_path, "context_window": 256, **entry}
    )
    kronk = Kronk(KronkConfig(base_path=tmp_path, models={"m": model}))
    try:
        with pytest.raises(ConfigError) as info:
            kronk.load("m")
        assert info.value.key == key
        assert "(registered: " in str(info.value) and registered in str(info.value)
        assert kronk.get_loaded("m") is None
    finally:
        kronk.close()


class DefaultNoCache:
    """A third party's cache strategy made the default: what an unset `cache:` selects."""

    @staticmethod
    @hookimpl
    def kronk_register_cache_strategies(register: Register[CacheStrategyFactory]) -> None:
        register("mine", no_cache, default=True)


def test_a_plugin_s_default_is_what_an_unset_key_selects(
    tmp_path: Path, tiny_llama_path: Path
) -> None:
    model = ModelConfig.model_validate({"model_path": tiny_llama_path, "context_window": 256})
    config = KronkConfig(base_path=tmp_path, models={"m": model})
    with Kronk(config) as kronk:
        cache = kronk.registry("cache_strategies")
        assert (cache.default, kronk.registry("template_processors").default) == ("imc", "jinja")
        assert kronk.registry("draft_strategies").default == "lookup"
        assert kronk.load("m").cache.name == "imc"
    with Kronk(config, plugins={"mine": DefaultNoCache}) as kronk:
        assert kronk.registry("cache_strategies").default == "mine"
        assert kronk.load("m").cache.name == "none"
    off = config.model_copy(update={"plugins": PluginSelection(disabled=["caching"])})
    with Kronk(off) as kronk:
        with pytest.raises(ConfigError) as info:
            kronk.load("m")
        assert info.value.key == "models.m.cache"
        assert "not set, and no active plugin registers a default" in str(info.value)
