"""Model configuration: validation errors name the offending key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kronk_core import Kronk, KronkConfig
from kronk_core.config import (
    CacheType,
    ModelConfig,
    load_model_config_file,
    parse_model_config,
)
from kronk_core.errors import ConfigError
from kronk_core.models import resolve_model_config


def config_error(data: dict[str, Any], model_id: str = "m1") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_model_config(model_id, data)
    return info.value


def test_valid_config_parses_with_defaults() -> None:
    config = parse_model_config("m1", {"n_batch": 1024, "n_ubatch": 1024, "cache_type_k": "Q8_0"})
    assert config.id == "m1"
    assert config.n_batch == 1024 and config.n_ubatch == 1024
    assert config.cache_type_k is CacheType.q8_0  # case-insensitive
    assert config.cache_type_v is CacheType.f16
    # Message caching is on by default; SPC replaces it, incremental_cache: false turns it off.
    assert config.cache_strategy == "imc"
    assert parse_model_config("m1", {"incremental_cache": True}).cache_strategy == "imc"
    assert parse_model_config("m1", {"system_prompt_cache": True}).cache_strategy == "spc"
    assert parse_model_config("m1", {"incremental_cache": False}).cache_strategy == "none"
    assert not config.swa_full and config.n_seq_max == 4


def test_ubatch_larger_than_batch_names_n_ubatch() -> None:
    error = config_error({"n_batch": 256, "n_ubatch": 512})
    assert "n_ubatch" in str(error)
    assert "512" in str(error) and "256" in str(error)
    assert error.key.startswith("models.m1")


def test_unknown_cache_type_names_cache_type_k() -> None:
    error = config_error({"cache_type_k": "q3_x"})
    assert error.key == "models.m1.cache_type_k"
    assert str(error).startswith("models.m1.cache_type_k:")


def test_negative_context_window_names_context_window() -> None:
    error = config_error({"context_window": -1})
    assert error.key == "models.m1.context_window"
    error = config_error({"context_window": 0})
    assert error.key == "models.m1.context_window"


def test_both_caches_on_is_an_error() -> None:
    error = config_error({"system_prompt_cache": True, "incremental_cache": True})
    assert "system_prompt_cache" in str(error)
    assert "incremental_cache" in str(error)


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
