"""A quiet, true console: one start-up line says what listens where and which models are
loaded with which windows; llama.cpp's "possible training context overflow", which counts
the whole KV pool all slots share, is no warning (a window per slot past the training
length still is); plugins register and optional services start without a line each."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_testing.plugin import SCRIPTED_MODEL_ID, ScriptedKronk

if TYPE_CHECKING:
    from kronk_testing.server import Serve

def ready_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("ready: ")]


def test_one_line_says_what_listens_where_and_what_is_loaded(
    scripted_kronk: ScriptedKronk,
    serve: Serve,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    port_finder: Callable[[], int],
) -> None:
    kronk = scripted_kronk({SCRIPTED_MODEL_ID: {"n_seq_max": 3}})
    debug_port = port_finder()
    settings = ServerSettings.model_validate(
        {
            "base_path": tmp_path,
            "api_host": "127.0.0.1:8123",
            "debug": {"host": f"127.0.0.1:{debug_port}"},
            "mcp": {"listen": "127.0.0.1:0"},  # a free port, which the line names
        }
    )
    with caplog.at_level(logging.DEBUG), serve(create_app(settings, kronk=kronk), lifespan="on"):
        pass
    (line,) = ready_lines(caplog)
    found = re.fullmatch(
        r"ready: API http://127\.0\.0\.1:8123, UI http://127\.0\.0\.1:8123/, "
        r"debug http://127\.0\.0\.1:(\d+), MCP http://127\.0\.0\.1:(\d+); (.*)",
        line,
    )
    assert found is not None, line
    assert int(found[1]) == debug_port and int(found[2]) > 0
    assert found[3] == (
        f"no model loaded yet (the default, {SCRIPTED_MODEL_ID}, loads on first use)"
    )
    # What the summary says is not said again, louder, on the way.
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert not [m for m in loud if m.startswith(("registered plugin", "debug server on"))]
    assert not [m for m in loud if "serving MCP" in m or "Brave Search API key" in m]

    caplog.clear()  # the server's shutdown closed that Kronk: a second, its model preloaded
    kronk = scripted_kronk({SCRIPTED_MODEL_ID: {"n_seq_max": 3}})
    settings = settings.model_copy(update={"preload": True})
    with caplog.at_level(logging.INFO), serve(create_app(settings, kronk=kronk), lifespan="on"):
        pass
    (line,) = ready_lines(caplog)
    assert line.endswith(f"; loaded: {SCRIPTED_MODEL_ID} (3 slots of 4096 tokens)")


def test_a_shared_pool_past_the_training_length_is_no_warning(
    tiny_llama_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Four slots of the tiny model's 256 trained tokens: llama.cpp sees 1024 > 256 in one
    shared pool and says "possible training context overflow"; that is logged at debug only.
    A window of 512 per slot is past the training length: that is a warning."""
    pool = {"kv_unified": True}  # `auto` gives this model a stream per slot
    models = {
        "pool": ModelConfig(
            model_path=tiny_llama_path, n_seq_max=4, context_window=256, llamacpp=pool
        ),
        "long": ModelConfig(model_path=tiny_llama_path, n_seq_max=1, context_window=512),
    }
    # llama.cpp's own logger too: a CLI command run in-process before may have quieted it.
    with (
        caplog.at_level(logging.DEBUG),
        caplog.at_level(logging.DEBUG, logger="kronk.llama"),
        Kronk(KronkConfig(base_path=tmp_path, models=models)) as k,
    ):
        k.load("pool")
        pool = [r for r in caplog.records if "possible training context overflow" in r.getMessage()]
        assert pool and all(r.levelno == logging.DEBUG for r in pool)
        k.load("long")
    beyond = "beyond the model's training length"
    (warning,) = [r for r in caplog.records if beyond in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert "context_window 512 of long is beyond the model's training length 256" in (
        warning.getMessage()
    )
