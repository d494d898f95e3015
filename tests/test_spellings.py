"""Other spellings of plugins' settings, read by the plugins that declare them: the Kronk
manual's flat model keys and server flags (for good, no warning), this project's moved keys
(one more release, warned), and the manual's yes/no keys that choose a core key."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from kronk_api.options import ServerStartCommand
from kronk_api.settings import ServerSettings, bind_sections, load_settings, server_sections
from kronk_core import Kronk, KronkConfig
from kronk_core.contract.errors import ConfigError
from kronk_core.contract.plugins import create_plugin_manager
from kronk_core.runtime.loading import model_config_for
from kronk_core.settings.config import load_model_config_file, parse_model_config


def bound(tmp_path: Path, entry: dict[str, Any]) -> dict[str, Any]:
    """The entry as the plugins read it: each section's settings as set, and the core keys."""
    kronk = Kronk(KronkConfig(base_path=tmp_path, models={"m1": parse_model_config("m1", entry)}))
    config = kronk.config.models["m1"]
    found: dict[str, Any] = {"cache": config.cache, "draft_strategy": config.draft_strategy}
    for name, section in config.sections.items():
        if section.model_fields_set:
            found[name] = section.model_dump(exclude_unset=True)
    return found


def warned(caplog: pytest.LogCaptureFixture) -> list[str]:
    sections = "kronk_core.settings.sections"
    return [record.getMessage() for record in caplog.records if record.name == sections]


def bind_error(tmp_path: Path, entry: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        bound(tmp_path, entry)
    return info.value


def test_the_manual_s_flat_keys_are_read_without_warnings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entry = {
        "n_ubatch": 256,
        "cache_type_k": "Q8_0",
        "cache-type-v": "q8_0",
        "flash_attention": "enabled",
        "nthreads": 2,
        "cache_min_tokens": 50,
        "incremental_cache": True,
        "use-mmap": False,
    }
    with caplog.at_level(logging.WARNING):
        found = bound(tmp_path, entry)
    assert found == {
        "cache": "imc",
        "draft_strategy": None,
        "llamacpp": {
            "n_ubatch": 256,
            "cache_type_k": "q8_0",
            "cache_type_v": "q8_0",
            "flash_attention": "enabled",
            "n_threads": 2,
        },
        "caching": {"cache_min_tokens": 50},
    }
    assert warned(caplog) == [
        "models.m1.use-mmap is ignored: llama.cpp maps model files as it does by default"
    ]


def test_this_project_s_moved_keys_still_work_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        found = bound(tmp_path, {"template": "gemma", "host_cache_bytes": 0})
    assert found["templates"] == {"template": "gemma"}
    assert found["caching"] == {"host_cache_bytes": 0}
    assert set(warned(caplog)) == {
        "models.m1.template is deprecated and will be removed in the next release; "
        "write models.m1.templates.template",
        "models.m1.host_cache_bytes is deprecated and will be removed in the next release; "
        "write models.m1.caching.host_cache_bytes",
    }


def test_a_key_written_two_ways_is_an_error(tmp_path: Path) -> None:
    error = bind_error(tmp_path, {"swa_full": False, "llamacpp": {"swa_full": True}})
    assert error.key == "models.m1.swa_full"
    assert "another spelling of models.m1.llamacpp.swa_full; set only that" in str(error)
    error = bind_error(tmp_path, {"template": "gemma", "templates": {"template": "chatml"}})
    assert "deprecated alias of models.m1.templates.template" in str(error)


@pytest.mark.parametrize(
    ("entry", "cache"),
    [
        ({"incremental_cache": True}, "imc"),
        ({"incremental-cache": True}, "imc"),
        ({"system_prompt_cache": True}, "spc"),
        ({"system-prompt-cache": True}, "spc"),
        ({"incremental_cache": False}, "none"),
        ({"system_prompt_cache": True, "incremental_cache": False}, "spc"),
        ({"system_prompt_cache": False}, None),  # unset: the registry's default (imc)
        ({"incremental_cache": True, "cache": "imc"}, "imc"),
    ],
)
def test_the_manual_s_cache_switches(
    tmp_path: Path, entry: dict[str, Any], cache: str | None
) -> None:
    assert bound(tmp_path, entry)["cache"] == cache


def test_switches_that_contradict_are_errors(tmp_path: Path) -> None:
    error = bind_error(tmp_path, {"system_prompt_cache": True, "incremental_cache": True})
    assert "system_prompt_cache" in str(error) and "incremental_cache" in str(error)
    assert "mutually exclusive" in str(error)
    error = bind_error(tmp_path, {"incremental_cache": True, "cache": "spc"})
    assert error.key == "models.m1.cache"


def test_the_manual_s_draft_model_block_is_the_speculative_section(tmp_path: Path) -> None:
    block = {"model-id": "Qwen3-0.6B-Q8_0", "ndraft": 5, "ngpu-layers": 0}
    found = bound(tmp_path, {"draft-model": block})
    assert found["speculative"] == {"model_id": "Qwen3-0.6B-Q8_0", "ndraft": 5, "n_gpu_layers": 0}
    assert found["draft_strategy"] == "draft"  # the block turns speculation on
    error = bind_error(tmp_path, {"draft-model": block, "speculative": {"ndraft": 3}})
    assert "another name of models.m1.speculative" in str(error)


def test_the_manual_s_device_and_gpu_keys(tmp_path: Path) -> None:
    assert bound(tmp_path, {"device": "CUDA0"})["llamacpp"] == {"device": "CUDA0"}
    assert bound(tmp_path, {"device": ""})["llamacpp"] == {"device": None}
    entry = {"main-gpu": 1, "tensor-split": [3, 1], "swa-full": True}
    assert bound(tmp_path, entry)["llamacpp"] == {
        "main_gpu": 1,
        "tensor_split": [3.0, 1.0],
        "swa_full": True,
    }


def test_gpu_layers_in_kronk_s_convention_or_llama_cpp_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n_gpu_layers is the manual's (0 all, -1 none); gpu_layers and GGML_N_GPU_LAYERS are
    llama.cpp's (-1 all, 0 none), the variable above any setting; words say either plainly."""
    monkeypatch.delenv("GGML_N_GPU_LAYERS", raising=False)

    def layers(entry: dict[str, Any]) -> Any:
        return bound(tmp_path, entry)["llamacpp"]

    assert layers({"n_gpu_layers": "all"}) == {"n_gpu_layers": 0}
    assert layers({"ngpu-layers": "none"}) == {"n_gpu_layers": -1}
    assert layers({"gpu_layers": 99}) == {"n_gpu_layers": 99}  # the manual's 16.7
    assert layers({"gpu_layers": -1}) == layers({"gpu_layers": "auto"}) == {"n_gpu_layers": 0}
    assert layers({"gpu_layers": 0}) == layers({"gpu_layers": "none"}) == {"n_gpu_layers": -1}
    assert "set one" in str(bind_error(tmp_path, {"gpu_layers": 10, "n_gpu_layers": 0}))
    assert "greater than or equal to -1" in str(bind_error(tmp_path, {"gpu_layers": -2}))
    monkeypatch.setenv("GGML_N_GPU_LAYERS", "0")
    assert layers({"n_gpu_layers": 5}) == {"n_gpu_layers": -1}
    monkeypatch.setenv("GGML_N_GPU_LAYERS", "lots")
    assert "GGML_N_GPU_LAYERS='lots' is not a layer count" in str(bind_error(tmp_path, {}))


def test_rpc_servers_as_a_list_or_as_llama_server_s_comma_string(tmp_path: Path) -> None:
    servers = ["10.0.0.2:50052", "gpu-box:50052"]
    assert bound(tmp_path, {"rpc_servers": servers})["llamacpp"] == {"rpc_servers": servers}
    assert bound(tmp_path, {"rpc": "10.0.0.2:50052, gpu-box:50052"})["llamacpp"] == {
        "rpc_servers": servers
    }
    assert "10.0.0.2" in str(bind_error(tmp_path, {"rpc_servers": ["10.0.0.2"]}))
    twice = bind_error(tmp_path, {"rpc_servers": ["a:1", "a:1"]})
    assert "names a server twice" in str(twice)
    pinned = bind_error(tmp_path, {"device": "CUDA0", "rpc_servers": ["a:1"]})
    assert "set device or rpc_servers" in str(pinned)


def test_an_unknown_flat_key_is_refused(tmp_path: Path) -> None:
    error = bind_error(tmp_path, {"n_ubtach": 256})
    assert error.key == "models.m1.n_ubtach"
    assert "not a setting" in str(error)


def test_a_provided_model_s_flat_key_is_overridden_by_the_entry(tmp_path: Path) -> None:
    """A catalog's `cache-type-k` and the entry's `llamacpp.cache_type_k` are one key."""
    model_file = tmp_path / "pulled.gguf"
    model_file.write_bytes(b"GGUF")
    provided = {"model_path": str(model_file), "cache-type-k": "q8_0", "nubatch": 128}

    class Catalog:
        from kronk_core.contract.plugins import hookimpl

        @hookimpl
        def kronk_models(self) -> dict[str, Any]:
            return {"pulled": provided}

    entry = {"llamacpp": {"cache_type_k": "f16"}}
    config = KronkConfig(base_path=tmp_path, models={"pulled": parse_model_config("pulled", entry)})
    kronk = Kronk(config, plugins={"test-catalog": Catalog()})
    llama = model_config_for(kronk, "pulled").sections["llamacpp"]
    assert (llama.cache_type_k, llama.n_ubatch) == ("f16", 128)


def test_the_manual_s_model_config_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "model_config.yaml"
    path.write_text(
        "models:\n"
        "  Qwen3-8B-Q8_0:\n"
        "    context_window: 32768\n"
        "    n_batch: 2048\n"
        "    n_ubatch: 512\n"
        "    n_seq_max: 2\n"
        "    cache_type_k: q8_0\n"
        "    cache_type_v: q8_0\n"
        "    flash_attention: enabled\n"
        "    system_prompt_cache: true\n",
        encoding="utf-8",
    )
    kronk = Kronk(KronkConfig(base_path=tmp_path, models=load_model_config_file(path)))
    config = kronk.config.models["Qwen3-8B-Q8_0"]
    assert config.cache == "spc"
    assert config.sections["llamacpp"].cache_type_k == "q8_0"


def test_the_manual_s_server_spellings(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`auth_enabled` (the manual's file key, `--auth-enabled`, `KRONK_AUTH_ENABLED`) is the
    auth-jwt plugin's `enabled`; a flag given the rule's way beats the file's."""
    manager = create_plugin_manager()
    sections = server_sections(manager)
    file = tmp_path / "settings.yaml"
    file.write_text("auth_enabled: true\nauth_issuer: acme\nauth_limit_store: sqlite\n")
    with caplog.at_level(logging.WARNING):
        settings = bind_sections(load_settings(file, {}, sections), manager)
        overridden = bind_sections(
            load_settings(file, {"auth-jwt": {"enabled": False}}, sections), manager
        )
        late = bind_sections(load_settings(file, {}), manager)  # spelled when bound
    auth = settings.sections["auth-jwt"]
    assert (auth.enabled, auth.issuer, auth.limit_store) == (True, "acme", "sqlite")
    assert overridden.sections["auth-jwt"].enabled is False
    assert late.sections["auth-jwt"] == auth
    assert set(warned(caplog)) == {
        "auth_limit_store is deprecated and will be removed in the next release; "
        "write auth-jwt.limit_store"
    }


def test_the_manual_s_cors_and_debug_names(tmp_path: Path) -> None:
    """`cors_allowed_origins` (file key, `--cors-allowed-origins`, its variable, and the
    manual's `KRONK_WEB_CORS_ALLOWED_ORIGINS`) is `cors_origins`; `KRONK_WEB_DEBUG_HOST` is
    the debug plugin's `host`."""
    command = ServerStartCommand("start")
    origins = ["http://a.example", "http://b.example"]
    for params, environ in (
        ({"other__cors_allowed_origins": ",".join(origins)}, {}),
        ({}, {"KRONK_CORS_ALLOWED_ORIGINS": ",".join(origins)}),
        ({}, {"KRONK_WEB_CORS_ALLOWED_ORIGINS": ",".join(origins)}),
    ):
        settings = ServerSettings.model_validate(command.overrides(params, environ))
        assert settings.cors_origins == origins, (params, environ)
    file = tmp_path / "settings.yaml"
    file.write_text("cors_allowed_origins: [http://a.example]\n")
    assert load_settings(file, {}).cors_origins == ["http://a.example"]
    file.write_text("cors_allowed_origins: [http://a.example]\ncors_origins: [http://c]\n")
    with pytest.raises(ConfigError, match="another spelling of cors_origins"):
        load_settings(file, {})
    debug = command.overrides({}, {"KRONK_WEB_DEBUG_HOST": "127.0.0.1:9999"})
    assert debug == {"debug": {"host": "127.0.0.1:9999"}}
