"""Kronk's pytest plugin (entry point `pytest11: kronk`): fixtures for Kronk and its plugins.

pytest loads it in every run where kronk is installed, so it imports only pytest and the
standard library here; each fixture imports what it needs. Models load on first use, and
generated test models are cached across sessions (`<cache>/test-models`). Disable it with
`-p no:kronk`. docs/plugins.md ("Testing your plugin") describes every fixture.

Under CI=true (CI machines set it) a skipped test fails, naming its reason: a CI machine that
lacks a tool some tests need (HAProxy, nginx, Chromium, a compiler) must not pass green
without running them. Every run ends with the count of skipped tests ("skipped: N").

The suite has two tiers. A test is marked `model` (the full tier) when it needs a real model:
one of its fixtures, or its own code, or a fixture's, names what loads a packaged model
(SmolLM2, Gemma), the converted MiniLM or the session-wide Kronk; and `process` (the full
tier too) when that code, or a function of its module that it calls, starts a process
(`subprocess`, `sys.executable`, `kronk_api.cli`: a server started as a user starts one). A
test may say so itself with `@pytest.mark.model`, a module with `pytestmark`.
`-m "not model and not process"` is the quick tier (`nox -s quick`): pure Python, the scripted
model and the tiny generated models, in-process. Under that selection llama.cpp is refused
any real model's file, and a test that loads one anyway fails, saying it belongs to the full
tier.
"""

from __future__ import annotations

import functools
import inspect
import os
import signal
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

from kronk_testing.models import TINY_LFM2, TINY_LFM2_SWA, TINY_MAMBA2

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

    from kronk_api import ServerSettings
    from kronk_core import Kronk
    from kronk_testing.redis_server import RedisServer
    from kronk_testing.scripted import Script
    from kronk_testing.server import RunningServer, Serve

# The default model again, with the Incremental Message Cache on (loaded on first use).
IMC_MODEL_ID = "gemma-3-270m-imc"
# The model `fake_kronk` serves.
SCRIPTED_MODEL_ID = "scripted"


def generated_models_dir() -> Path:
    """Where generated test models are cached across sessions, like the default model."""
    from kronk_core.contract import cache_dir

    return cache_dir() / "test-models"


def packaged() -> Any:
    """The llamacpp plugin's packaged models, imported when a fixture needs them: a session
    without that plugin (nox -s core) loads this plugin too."""
    from kronk_llamacpp import packaged as models

    return models


# ---- skips: a developer's machine may skip, CI may not ----------------------------------

SKIPPED = pytest.StashKey[int]()
CI_VALUES = {"true", "1", "yes"}


def in_ci() -> bool:
    """Whether this run is CI's: CI set to true, as CI services and .ci/run's caller set it."""
    return os.environ.get("CI", "").strip().lower() in CI_VALUES


def _counted_skip(config: pytest.Config, report: pytest.TestReport | pytest.CollectReport) -> None:
    """Count a skip; in CI, turn it into a failure that names the skip's reason."""
    config.stash[SKIPPED] = config.stash.get(SKIPPED, 0) + 1
    if not in_ci():
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped under CI=true, where every test must run: {reason}"


def pytest_configure(config: pytest.Config) -> None:
    config.stash[SKIPPED] = 0
    config.addinivalue_line("markers", f"{MODEL}: needs a real model (the full tier)")
    config.addinivalue_line("markers", f"{PROCESS}: starts a process of its own (the full tier)")
    if str(config.getoption("markexpr", "")) == QUICK_SELECTION:
        _guard_real_models()
    # A suite started in the background by a script (`cmd &` in a shell without job control)
    # inherits SIGINT ignored, and so would every process it starts: the tests of what
    # Ctrl-C does would see nothing happen.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# ---- tiers ----------------------------------------------------------------------------

MODEL = "model"
PROCESS = "process"
QUICK_SELECTION = f"not {MODEL} and not {PROCESS}"
FULL_SELECTION = f"{MODEL} or {PROCESS}"
# What a test or fixture names when it needs a real model: the harness's fixtures of real
# models (and of the Kronk and server built on them), the packaged models' paths and ids.
_MODEL_FIXTURES = frozenset(
    {"gemma_path", "minilm_path", "gemma_draft_path", "other_vocabulary_path", "kronk",
     "server", "imc_model"}
)  # fmt: skip
_MODEL_NAMES = (
    "default_model_path", "gemma_model_path", "DEFAULT_MODEL_ID", "GEMMA_MODEL_ID",
    "IMC_MODEL_ID",
)  # fmt: skip
# What starts a process of its own (a Python interpreter's start-up alone costs seconds on
# 2 cores): a server as a user starts one, a CLI command, a build.
_PROCESS_NAMES = ("kronk_api.cli", "subprocess.", "sys.executable", "Popen(")


@functools.cache
def _source(function: Callable[..., Any]) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def _sources(item: pytest.Function) -> str:
    """The test's code and its fixtures', with that of the module's functions they call."""
    functions = [item.function]
    for definitions in item._fixtureinfo.name2fixturedefs.values():
        functions += [definition.func for definition in definitions]
    texts = [_source(function) for function in functions]
    helpers = vars(item.module) if item.module is not None else {}
    called = {
        name
        for name, value in helpers.items()
        if callable(value) and any(f"{name}(" in text for text in texts)
    }
    texts += [_source(helpers[name]) for name in called]
    return "\n".join(texts)


def _tier_markers(item: pytest.Function) -> list[str]:
    if item.get_closest_marker(MODEL) and item.get_closest_marker(PROCESS):
        return []
    source = _sources(item)
    markers = []
    if _MODEL_FIXTURES & set(item.fixturenames) or any(name in source for name in _MODEL_NAMES):
        markers.append(MODEL)
    if any(name in source for name in _PROCESS_NAMES):
        markers.append(PROCESS)
    return markers


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if isinstance(item, pytest.Function):
            for marker in _tier_markers(item):
                item.add_marker(marker)


# Real models a quick-tier test loaded, by file name, since its last report.
_REAL_LOADS: list[str] = []


def _real_model_sizes() -> set[int]:
    """The sizes of the real model files (the packaged ones, the Gemma draft, MiniLM): a
    file of one of those sizes is one of them, wherever a test copied it."""
    from kronk_llamacpp import packaged
    from kronk_testing.models.draft import GEMMA_DRAFT
    from kronk_testing.models.minilm import MINILM

    files = [packaged.default_model_path(), packaged.gemma_model_path()]
    files += [generated_models_dir() / name for name in (GEMMA_DRAFT, MINILM)]
    return {path.stat().st_size for path in files if path.is_file()}


def _guard_real_models() -> None:
    """The quick tier loads no real model: llama.cpp is refused the file (the load fails as
    a bad file does), and the test that asked fails, saying where it belongs."""
    import llama_cpp

    real = _real_model_sizes()
    load = llama_cpp.llama_model_load_from_file

    def guarded(path: bytes, params: Any) -> Any:
        file = Path(os.fsdecode(path))
        if file.is_file() and file.stat().st_size in real:
            _REAL_LOADS.append(file.name)
            return None
        return load(path, params)

    llama_cpp.llama_model_load_from_file = guarded


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.skipped and not hasattr(report, "wasxfail"):  # an xfail is not a skip
        _counted_skip(item.config, report)
    if _REAL_LOADS:
        loaded = ", ".join(sorted(set(_REAL_LOADS)))
        _REAL_LOADS.clear()
        report.outcome = "failed"
        report.longrepr = (
            f"this test loads a real model ({loaded}): it belongs to the full tier "
            f"(mark it @pytest.mark.{MODEL})"
        )
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    if report.skipped:  # a module that skips itself (importorskip, allow_module_level)
        _counted_skip(collector.config, report)
    return report


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    skipped = config.stash.get(SKIPPED, 0)
    failed = " (CI=true: each one failed)" if skipped and in_ci() else ""
    terminalreporter.write_line(f"skipped: {skipped}{failed}")


# ---- models -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def gemma_path() -> str:
    """Gemma 3 270M (Q4_K_M, sliding-window attention) from its PyPI package."""
    return str(packaged().gemma_model_path())


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """The real all-MiniLM-L6-v2, converted to GGUF (kronk_testing.models.minilm, first use)."""
    from kronk_testing.models.minilm import minilm_gguf

    return minilm_gguf(generated_models_dir())


@pytest.fixture(scope="session")
def reranker_path() -> Path:
    """A tiny random-weight cross-encoder (kronk_testing.models.reranker, first use)."""
    from kronk_testing.models.reranker import tiny_reranker_gguf

    return tiny_reranker_gguf(generated_models_dir())


@pytest.fixture(scope="session")
def tiny_llama_path() -> Path:
    """A tiny random-weight chat model (fast to load and to generate with)."""
    from kronk_testing.models.tiny import TINY_LLAMA, make_tiny_llama

    path = generated_models_dir() / TINY_LLAMA
    return path if path.is_file() else make_tiny_llama(path)


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium (a missing one fails the test: CI installs it)."""
    from kronk_testing.browser import chromium_path

    return chromium_path()


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[Browser]:
    """Chromium driven by Playwright, for a module's page tests (kronk_testing.browser)."""
    from kronk_testing.browser import launched_browser

    yield from launched_browser(chromium)


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh page; a script error on it fails the test (kronk_testing.browser)."""
    from kronk_testing.browser import checked_page

    yield from checked_page(browser)


@pytest.fixture(scope="session")
def tiny_fim_path() -> Path:
    """The tiny chat model with fill-in-the-middle tokens in its metadata (a code model's)."""
    from kronk_testing.models.tiny import TINY_FIM, make_tiny_fim

    path = generated_models_dir() / TINY_FIM
    return path if path.is_file() else make_tiny_fim(path)


@dataclass(frozen=True)
class MultimodalPaths:
    model: Path
    vision: Path
    audio: Path
    both: Path


@pytest.fixture(scope="session")
def multimodal_paths() -> MultimodalPaths:
    """The tiny chat model and its vision, audio and vision+audio projectors
    (kronk_testing.models.multimodal, first use)."""
    from kronk_testing.models import multimodal

    names = (
        multimodal.TINY_MM_LLAMA,
        multimodal.VISION_PROJECTOR,
        multimodal.AUDIO_PROJECTOR,
        multimodal.BOTH_PROJECTOR,
    )
    files = [generated_models_dir() / name for name in names]
    if not all(path.is_file() for path in files):
        multimodal.make_tiny_multimodal(files[0])
    return MultimodalPaths(*files)


@dataclass(frozen=True)
class QwenVlPaths:
    model: Path
    vision: Path


@pytest.fixture(scope="session")
def qwen_vl_paths() -> QwenVlPaths:
    """The tiny Qwen2.5-VL-shaped model and its M-RoPE vision projector
    (kronk_testing.models.qwen_vl, first use)."""
    from kronk_testing.models import qwen_vl

    files = [
        generated_models_dir() / name for name in (qwen_vl.TINY_QWEN_VL, qwen_vl.QWEN_VL_PROJECTOR)
    ]
    if not all(path.is_file() for path in files):
        qwen_vl.make_tiny_qwen_vl(files[0])
    return QwenVlPaths(*files)


@pytest.fixture(scope="session")
def gemma_draft_path() -> Path:
    """The default model requantized to Q4_0 (kronk_testing.models.draft): a draft model
    with its vocabulary that agrees with it most of the time."""
    from kronk_testing.models.draft import GEMMA_DRAFT, make_gemma_draft
    from kronk_testing.models.output import cached

    return cached(generated_models_dir() / GEMMA_DRAFT, make_gemma_draft)


@pytest.fixture(scope="session")
def other_vocabulary_path(minilm_path: Path) -> Path:
    """A tiny chat model with MiniLM's BERT vocabulary: a draft the default model refuses."""
    from kronk_testing.models.output import cached
    from kronk_testing.models.tiny import make_tiny_llama

    return cached(
        generated_models_dir() / "tiny-llama-bert-vocab.gguf",
        lambda path: make_tiny_llama(path, tokenizer=minilm_path),
    )


@pytest.fixture(scope="session")
def recurrent_models() -> dict[str, Path]:
    """Tiny models whose state cannot be cut back, by file name (kronk_testing.models.recurrent,
    first use): the hybrid LFM2, the same with a sliding window, and Mamba-2."""
    from kronk_testing.models.output import cached
    from kronk_testing.models.recurrent import MAKERS

    return {name: cached(generated_models_dir() / name, make) for name, make in MAKERS.items()}


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
    from kronk_testing.models.tiny import make_tiny_llama_split

    directory = generated_models_dir()
    parts = [directory / f"tiny-split-{n:05d}-of-00002.gguf" for n in (1, 2)]
    return parts if all(part.is_file() for part in parts) else make_tiny_llama_split(directory)


# ---- the SDK ------------------------------------------------------------------------


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
    from kronk_core import Kronk, KronkConfig
    from kronk_core.contract import ModelConfig

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
            # step, which the engine tests count (speculation: the speculative plugin's
            # tests/test_speculative.py).
            gemma.GEMMA_MODEL_ID: ModelConfig.model_validate(
                {
                    **gemma.GEMMA_MODEL_SETTINGS,
                    "context_window": 8192,
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


MakeKronk = Callable[..., "Kronk"]


@pytest.fixture
def make_kronk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MakeKronk]:
    """`make_kronk(models, *, plugins={}, enabled=(), disabled=(), load=None, **config)`:
    a Kronk of the test's own, closed when the test ends.

    `models` are model-config entries by id (mappings as in models.yaml); `plugins` are
    in-process plugins by name (as `Kronk(plugins=...)`), next to the installed ones;
    `enabled`/`disabled` select plugins by name (`KronkConfig.plugins`); `load` names a
    model to load now; `config` are other `KronkConfig` fields. The base path is a
    fresh temporary folder unless `config` names one.
    """
    from kronk_core import Kronk, KronkConfig
    from kronk_core.contract import PluginSelection

    made: list[Kronk] = []

    def make(
        models: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        plugins: Mapping[str, object] | None = None,
        enabled: Sequence[str] = (),
        disabled: Sequence[str] = (),
        load: str | None = None,
        **config: Any,
    ) -> Kronk:
        config.setdefault("base_path", tmp_path_factory.mktemp("kronk-home"))
        selection = PluginSelection(enabled=list(enabled), disabled=list(disabled))
        settings = KronkConfig.model_validate(
            {"models": dict(models or {}), "plugins": selection, **config}
        )
        instance = Kronk(settings, plugins=plugins)
        made.append(instance)
        if load is not None:
            instance.load(load)
        return instance

    yield make
    for instance in reversed(made):
        instance.close()


ScriptedKronk = Callable[..., "Kronk"]


@pytest.fixture
def scripted_kronk(make_kronk: MakeKronk, tmp_path: Path) -> Iterator[ScriptedKronk]:
    """`scripted_kronk(models={"id": {settings}}, *, script=Script(), **make_kronk options)`:
    a Kronk whose models are scripted (kronk_testing.scripted): no llama.cpp, instant
    decodes. Each entry gets `backend: scripted` and a script file as its `model_path`
    (its own with a `script` key holding a `Script`); the plugin is registered in-process.
    Without `models`: one model, SCRIPTED_MODEL_ID.
    """
    from kronk_testing import scripted

    def make(
        models: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        script: Script | None = None,
        **options: Any,
    ) -> Kronk:
        entries: dict[str, dict[str, Any]] = {}
        for model_id, settings in (models or {SCRIPTED_MODEL_ID: {}}).items():
            entry = dict(settings)
            own = entry.pop("script", None) or script
            path = scripted.write_script(tmp_path / "scripts" / f"{model_id}.json", own)
            entries[model_id] = {"backend": scripted.BACKEND, "model_path": path, **entry}
        options.setdefault("default_model", next(iter(entries)))
        plugins = {scripted.BACKEND: scripted, **options.pop("plugins", {})}
        instance = make_kronk(entries, plugins=plugins, **options)
        made.append(instance)
        return instance

    made: list[Kronk] = []
    yield make
    # A test that ended with a model paused would hold its engine's thread, and close().
    for instance in made:
        for loaded in instance.loaded_models():
            if isinstance(loaded.model, scripted.ScriptedModel):
                loaded.model.resume()


@pytest.fixture
def fake_kronk(scripted_kronk: ScriptedKronk) -> Kronk:
    """A Kronk serving one scripted model (SCRIPTED_MODEL_ID; the default script), loaded:
    2 slots, no message caching, no speculation."""
    settings = {"n_seq_max": 2, "cache": "none", "draft_strategy": "none"}
    return scripted_kronk({SCRIPTED_MODEL_ID: settings}, load=SCRIPTED_MODEL_ID)


# ---- servers ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def port_finder() -> Callable[[], int]:
    """A function that returns a free TCP port on 127.0.0.1."""
    from kronk_testing.server import free_port

    return free_port


@pytest.fixture(scope="session")
def serve() -> Serve:
    """`with serve(app) as base_url:` runs app on a real uvicorn (kronk_testing.server.serving)."""
    from kronk_testing.server import serving

    return serving


@pytest.fixture(scope="session")
def server(kronk: Kronk) -> Iterator[RunningServer]:
    """A real uvicorn on 127.0.0.1 (free port) serving the session's Kronk instance."""
    from kronk_api import ServerSettings, create_app
    from kronk_testing.server import RunningServer, serving

    app = create_app(ServerSettings(), kronk=kronk)
    with serving(app, lifespan="off") as base_url:
        yield RunningServer(base_url=base_url, kronk=kronk, app=app)


MakeServer = Callable[..., "RunningServer"]


@pytest.fixture
def make_server() -> Iterator[MakeServer]:
    """`make_server(kronk, settings=None, *, lifespan="off")`: the app the active plugins
    compose for `kronk` (ServerSettings() unless given), on a real uvicorn until the test
    ends. With lifespan "on" the plugins' startup and shutdown run, and shutdown closes
    `kronk`."""
    from kronk_api import ServerSettings, create_app
    from kronk_testing.server import RunningServer, serving

    with ExitStack() as stack:

        def make(
            kronk: Kronk,
            settings: ServerSettings | None = None,
            *,
            lifespan: Literal["on", "off"] = "off",
        ) -> RunningServer:
            app = create_app(settings or ServerSettings(), kronk=kronk)
            base_url = stack.enter_context(serving(app, lifespan=lifespan))
            return RunningServer(base_url=base_url, kronk=kronk, app=app)

        yield make


# ---- Redis --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server for the whole session."""
    from kronk_testing.redis_server import running_redis

    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server of the test's own, which the test may stop and start again."""
    from kronk_testing.redis_server import running_redis

    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server
