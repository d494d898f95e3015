"""Devices, the memory estimate (manual 3.7) and the refusal before a load, on real llama.cpp.

Here the only device is the CPU, whose memory is the machine's RAM; the placement rules
for GPUs are the same code with other device names.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import httpx
import pytest
from click.testing import CliRunner

from kronk_api.cli import main
from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_core.contract.errors import ConfigError, InsufficientMemoryError, ModelLoadError
from kronk_llamacpp.packaged import GEMMA_MODEL_ID, GEMMA_MODEL_SETTINGS

GIB = 2**30


def _kronk(tmp_path: Path, **models: dict[str, object]) -> Kronk:
    configs = {name: ModelConfig.model_validate(values) for name, values in models.items()}
    return Kronk(KronkConfig(base_path=tmp_path, models=configs))


def _manual_example(path: Path) -> Path:
    """A header-only GGUF shaped like the manual's worked example (Qwen3-Coder-30B-A3B)."""
    writer = gguf.GGUFWriter(path, "qwen3moe")
    writer.add_block_count(48)
    writer.add_context_length(262144)
    writer.add_embedding_length(2048)
    writer.add_head_count(32)
    writer.add_head_count_kv(4)
    writer.add_key_length(128)
    writer.add_value_length(128)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def test_devices_list_the_cpu_with_its_memory(kronk: Kronk) -> None:
    devices = kronk.models.devices()
    cpu = next(device for device in devices if device.type == "cpu")
    assert cpu.name == "CPU"
    ram = Path("/proc/meminfo").read_text().split()
    total_kib = int(ram[ram.index("MemTotal:") + 1])
    assert abs(cpu.memory_total - total_kib * 1024) < 64 * 2**20
    assert 0 < cpu.memory_free <= cpu.memory_total


def test_estimate_of_the_default_model_matches_llama_cpp(kronk: Kronk, gemma_path: str) -> None:
    """Same bytes per token as the loaded model reports; weights = the file."""
    loaded = kronk.get_loaded()
    assert loaded is not None
    found = kronk.models.memory_estimate(GEMMA_MODEL_ID)
    assert found is not None
    assert found.kv_bytes_per_token == loaded.info.kv_bytes_per_token
    assert found.weights_bytes == Path(gemma_path).stat().st_size
    assert (found.context_window, found.n_seq_max) == (8192, 4)
    assert found.kv_bytes == 8192 * 4 * found.kv_bytes_per_token
    # llama.cpp's own allocation: weights plus the contexts it opened.
    assert abs(found.total_bytes - loaded.info.memory_bytes) < 0.05 * found.total_bytes
    (share,) = found.placement
    assert share.device == "CPU" and share.total_bytes == found.total_bytes and share.fits


def test_estimate_follows_the_manuals_formula(tmp_path: Path) -> None:
    """Manual 3.7: 4 x (128 + 128) x bytes per element, x 48 layers, x context x slots."""
    path = _manual_example(tmp_path / "example.gguf")
    kronk = _kronk(
        tmp_path,
        f16={"model_path": path, "context_window": 131072, "n_seq_max": 2},
        q8={"model_path": path, "context_window": 131072, "n_seq_max": 2,
            "llamacpp": {"cache_type_k": "q8_0", "cache_type_v": "q8_0"}},
    )  # fmt: skip
    f16 = kronk.models.memory_estimate("f16")
    q8 = kronk.models.memory_estimate("q8")
    assert f16 is not None and q8 is not None
    assert f16.n_layer == 48
    assert f16.kv_bytes_per_token == 48 * 4 * (128 + 128) * 2
    assert f16.kv_bytes == 2 * 131072 * 48 * 2048  # 24 GiB
    # q8_0 stores 32 values in 34 bytes: the manual's "1 byte" plus the block scales.
    assert q8.kv_bytes_per_token == 48 * 4 * 256 * 34 // 32
    assert q8.kv_bytes_per_slot == pytest.approx(6.8e9, rel=0.01)  # the manual's ~6.4 GB + scales


def test_a_load_that_cannot_fit_is_refused_before_llama_cpp(tmp_path: Path) -> None:
    """The header-only file has no tensors: reaching llama.cpp would fail differently."""
    path = _manual_example(tmp_path / "example.gguf")
    kronk = _kronk(tmp_path, big={"model_path": path, "context_window": 262144, "n_seq_max": 64})
    with pytest.raises(InsufficientMemoryError) as refused:
        kronk.load("big")
    message = refused.value.message
    assert (refused.value.status, refused.value.code) == (503, "insufficient_memory")
    assert "on CPU" in message and "context_window 262144 x n_seq_max 64" in message
    assert "lower context_window or n_seq_max" in message
    assert "llamacpp.cache_type_k and llamacpp.cache_type_v to q8_0" in message
    assert kronk.pool.entries() == []


def test_the_default_model_with_too_many_slots_is_refused(tmp_path: Path, gemma_path: str) -> None:
    settings = {**GEMMA_MODEL_SETTINGS, "model_path": gemma_path}
    kronk = _kronk(tmp_path, huge={**settings, "context_window": 32768, "n_seq_max": 256})
    with pytest.raises(InsufficientMemoryError, match="n_seq_max 256"):
        kronk.load("huge")


def test_device_pin_and_tensor_split_are_validated(tmp_path: Path, tiny_llama_path: Path) -> None:
    """Keys of the llamacpp section: checked when Kronk() is created, then against the devices."""
    both = {"llamacpp": {"device": "CPU", "tensor_split": [1.0]}}
    with pytest.raises(
        ConfigError, match=r"models\.m\.llamacpp\.tensor_split: .*set device or tensor_split"
    ):
        _kronk(tmp_path, m=both)
    with pytest.raises(ConfigError, match=r"models\.m\.llamacpp\.tensor_split: .*above 0"):
        _kronk(tmp_path, m={"llamacpp": {"tensor_split": [0, 0]}})
    # The manual's `device: ""` pins nothing, flat or in the section.
    unpinned = _kronk(tmp_path, m={"llamacpp": {"device": ""}})
    assert unpinned.config.models["m"].sections["llamacpp"].device is None
    unpinned.close()
    kronk = _kronk(
        tmp_path,
        gpu={"model_path": tiny_llama_path, "llamacpp": {"device": "CUDA0"}},
        split={"model_path": tiny_llama_path, "llamacpp": {"tensor_split": [1.0, 1.0]}},
        cpu={"model_path": tiny_llama_path, "n_seq_max": 1, "llamacpp": {"device": "CPU"}},
    )
    with pytest.raises(
        ModelLoadError, match=r"^models\.gpu\.llamacpp\.device: unknown device 'CUDA0'.*has: CPU"
    ):
        kronk.load("gpu")
    with pytest.raises(
        ModelLoadError, match=r"^models\.split\.llamacpp\.tensor_split: 2 shares for 0 GPU"
    ):
        kronk.load("split")
    assert kronk.load("cpu").info.n_seq_max == 1
    kronk.close()


def test_devices_endpoint_and_pool_estimate(server: Any) -> None:
    devices = httpx.get(f"{server.base_url}/v1/kronk/devices").json()
    assert [d["name"] for d in devices["data"]][:1] == ["CPU"]
    assert {"memory_free", "memory_total", "type", "description"} <= set(devices["data"][0])
    pool = httpx.get(f"{server.base_url}/v1/kronk/models").json()
    entry = next(e for e in pool["data"] if e["id"] == GEMMA_MODEL_ID)
    estimate = entry["memory_estimate"]
    assert estimate["n_seq_max"] == 4 and estimate["context_window"] == 8192
    assert estimate["total_bytes"] == estimate["weights_bytes"] + estimate["kv_bytes"]
    assert estimate["placement"][0]["device"] == "CPU"


def test_cli_devices_and_model_show(tmp_path: Path, tiny_llama_path: Path) -> None:
    runner = CliRunner()
    listed = runner.invoke(main, ["devices"])
    assert listed.exit_code == 0, listed.output
    assert listed.output.splitlines()[1].split()[:3] == ["0", "CPU", "cpu"]
    config = tmp_path / "models.yaml"
    config.write_text(
        f"models:\n  tiny:\n    model_path: {tiny_llama_path}\n    context_window: 256\n"
        "    n_seq_max: 2\n    llamacpp:\n      cache_type_k: q8_0\n"
    )
    shown = runner.invoke(
        main, ["model", "show", "tiny", "--model-config-file", str(config), "--base-path",
               str(tmp_path)],
    )  # fmt: skip
    assert shown.exit_code == 0, shown.output
    per_token = 2 * 2 * (16 * 34 // 32 + 16 * 2)  # layers x kv heads x (K q8_0 + V f16)
    assert f"context_window 256 x n_seq_max 2 x {per_token} bytes per token" in shown.output
    assert "cache_type_k q8_0" in shown.output and "on CPU:" in shown.output
    lines = shown.output.splitlines()
    assert "llamacpp.cache_type_k: q8_0" in lines
    assert {"architecture:    llama", "quantization:    F16"} <= set(lines)


def test_kronk_devices_command_in_a_fresh_process() -> None:
    """The installed `kronk` script: the plugins' preload runs before anything else."""
    done = subprocess.run(
        [sys.executable, "-m", "kronk_api.cli", "devices"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "CPU" in done.stdout
