"""Model configuration: validation errors name the offending key (the core alone)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kronk_core import Kronk, KronkConfig
from kronk_core.config import ModelConfig, load_model_config_file, parse_model_config
from kronk_core.errors import ConfigError
from kronk_core.models import resolve_model_config


def config_error(data: dict[str, Any], model_id: str = "m1") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_model_config(model_id, data)
    return info.value


def test_valid_config_parses_with_defaults() -> None:
    config = parse_model_config("m1", {"n_batch": 1024, "context_window": 4096})
    assert config.id == "m1"
    assert config.n_batch == 1024 and config.context_window == 4096
    assert config.n_seq_max == 4
    # Message caching is on by default.
    assert config.cache == "imc" and config.template_processor == "jinja"
    assert parse_model_config("m1", {"cache": "none"}).cache == "none"


def test_plugin_sections_are_kept_for_their_plugins() -> None:
    """Keys that hold a mapping are plugins' sections: validated once the plugins are known."""
    config = parse_model_config("m1", {"llamacpp": {"n_ubatch": 256}, "caching": {}})
    assert config.sections == {"llamacpp": {"n_ubatch": 256}, "caching": {}}
    assert config.section_key("llamacpp") == "models.m1.llamacpp"


def test_negative_context_window_names_context_window() -> None:
    error = config_error({"context_window": -1})
    assert error.key == "models.m1.context_window"
    error = config_error({"context_window": 0})
    assert error.key == "models.m1.context_window"


def test_deprecated_keys_move_to_their_sections_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="kronk_core.legacy"):
        config = parse_model_config(
            "m1",
            {
                "incremental_cache": True,
                "cache_type_k": "Q8_0",
                "template": "gemma",
                "host_cache_bytes": 0,
                "llamacpp": {"n_threads": 2},
            },
        )
    assert config.cache == "imc"
    assert config.sections == {
        "llamacpp": {"n_threads": 2, "cache_type_k": "Q8_0"},
        "templates": {"template": "gemma"},
        "caching": {"host_cache_bytes": 0},
    }
    warned = {record.getMessage() for record in caplog.records}
    assert (
        "models.m1.cache_type_k is deprecated and will be removed in the next release; "
        "write models.m1.llamacpp.cache_type_k" in warned
    )
    assert any("models.m1.incremental_cache is deprecated" in line for line in warned)
    assert parse_model_config("m1", {"system_prompt_cache": True}).cache == "spc"
    assert parse_model_config("m1", {"incremental_cache": False}).cache == "none"


def test_a_deprecated_key_beside_its_new_place_is_an_error() -> None:
    error = config_error({"swa_full": False, "llamacpp": {"swa_full": True}})
    assert error.key == "models.m1.swa_full"
    assert "models.m1.llamacpp.swa_full" in str(error)
    error = config_error({"incremental_cache": True, "cache": "spc"})
    assert error.key == "models.m1.cache"


def test_both_caches_on_is_an_error() -> None:
    error = config_error({"system_prompt_cache": True, "incremental_cache": True})
    assert "system_prompt_cache" in str(error)
    assert "incremental_cache" in str(error)


def test_a_section_no_plugin_reads_is_refused(tmp_path: Path) -> None:
    """Without plugins (the core alone), every section is unknown: none is silently ignored."""
    config = KronkConfig(
        base_path=tmp_path, models={"m1": ModelConfig.model_validate({"speculative": {"n": 4}})}
    )
    with pytest.raises(ConfigError) as info:
        Kronk(config)
    assert info.value.key == "models.m1.speculative"
    assert "no active plugin reads this section" in str(info.value)


def test_bad_sampling_value_names_nested_key() -> None:
    error = config_error({"sampling": {"top_p": 0}})
    assert error.key == "models.m1.sampling.top_p"


def test_load_yaml_model_config_file(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(
        "models:\n"
        "  m1:\n"
        "    model_path: /models/one.gguf\n"
        "    context_window: 4096\n"
        "    n_seq_max: 2\n"
        "    sampling:\n"
        "      temperature: 0.3\n"
        "  m2: {}\n",
        encoding="utf-8",
    )
    models = load_model_config_file(path)
    assert sorted(models) == ["m1", "m2"]
    assert models["m1"].id == "m1"
    assert models["m1"].model_path == Path("/models/one.gguf")
    assert models["m1"].context_window == 4096
    assert models["m1"].n_seq_max == 2
    assert models["m1"].sampling.temperature == 0.3
    assert models["m2"] == ModelConfig(id="m2")


def test_unknown_key_in_yaml_is_named(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  m1:\n    n_batch: 512\n    bogus: 1\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_model_config_file(path)
    assert info.value.key == "models.m1.bogus"
    assert "models.m1.bogus" in str(info.value)


def test_unknown_top_level_key_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("models: {}\nmodles: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_model_config_file(path)
    assert info.value.key == "modles"
    with pytest.raises(ConfigError) as info:
        load_model_config_file(tmp_path / "absent.yaml")
    assert info.value.key == "model_config_file"
    (tmp_path / "empty.yaml").write_text("", encoding="utf-8")
    assert load_model_config_file(tmp_path / "empty.yaml") == {}


def test_missing_model_path_file_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "x.gguf"
    config = KronkConfig(base_path=tmp_path, models={"X": ModelConfig(model_path=missing)})
    with pytest.raises(ConfigError) as info:
        resolve_model_config(config, "X")
    assert info.value.key == "models.X.model_path"
    assert str(missing) in str(info.value)

    kronk = Kronk(config)
    try:
        with pytest.raises(ConfigError) as load_info:
            kronk.load("X")
        assert load_info.value.key == "models.X.model_path"
        assert str(load_info.value) == str(info.value)
        assert kronk.get_loaded("X") is None
    finally:
        kronk.close()


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("20m", 1200.0),
        ("1h30m", 5400.0),
        ("90s", 90.0),
        ("250ms", 0.25),
        ("1.5h", 5400.0),
        (7, 7.0),
    ],
)
def test_cache_ttl_takes_the_manual_s_durations(value: str | int, seconds: float) -> None:
    assert KronkConfig(cache_ttl=value).cache_ttl == seconds


@pytest.mark.parametrize("value", ["20x", "m20", "soon", "-5"])
def test_bad_cache_ttl_names_the_key(value: str) -> None:
    with pytest.raises(ValidationError) as info:
        KronkConfig(cache_ttl=value)
    assert info.value.errors()[0]["loc"] == ("cache_ttl",)


def test_pool_defaults_follow_the_manual() -> None:
    config = KronkConfig()
    assert (config.models_in_cache, config.cache_ttl) == (3, 1200.0)
