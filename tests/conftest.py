"""Shared fixtures: one real default model per test session."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import uvicorn

from kronk_api import ServerSettings, create_app
from kronk_core import DEFAULT_MODEL_ID, Kronk, KronkConfig
from kronk_core.config import ModelConfig
from kronk_core.models import DEFAULT_MODEL_SETTINGS, default_model_path


@pytest.fixture(scope="session")
def gemma_path() -> str:
    return str(default_model_path())


# The default model again, with the Incremental Message Cache on (loaded on first use).
IMC_MODEL_ID = "gemma-3-270m-imc"


@pytest.fixture(scope="session")
def kronk(tmp_path_factory: pytest.TempPathFactory, gemma_path: str) -> Iterator[Kronk]:
    """The default Gemma 3 270M with 4 slots, loaded once for the session."""
    imc = {
        **DEFAULT_MODEL_SETTINGS,
        "model_path": gemma_path,
        "context_window": 4096,
        "n_seq_max": 2,
        "incremental_cache": True,
    }
    config = KronkConfig(
        base_path=tmp_path_factory.mktemp("kronk-home"),
        queue_wait_seconds=2.0,
        models={
            DEFAULT_MODEL_ID: ModelConfig.model_validate(DEFAULT_MODEL_SETTINGS),
            IMC_MODEL_ID: ModelConfig.model_validate(imc),
        },
    )
    instance = Kronk(config)
    instance.load()
    yield instance
    instance.close()


@pytest.fixture(scope="session")
def imc_model() -> str:
    """Id of the default model with the Incremental Message Cache on (in the `kronk` fixture)."""
    return IMC_MODEL_ID


@dataclass
class RunningServer:
    base_url: str
    kronk: Kronk


@pytest.fixture(scope="session")
def server(kronk: Kronk) -> Iterator[RunningServer]:
    """A real uvicorn on 127.0.0.1 (free port) serving the session's Kronk instance."""
    app = create_app(ServerSettings(), kronk=kronk)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    instance = uvicorn.Server(config)
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not instance.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    yield RunningServer(base_url=f"http://127.0.0.1:{port}", kronk=kronk)
    instance.should_exit = True
    thread.join(timeout=10)
