"""Smoke test of Kronk's built wheels in a fresh virtual environment (`nox -s packages`).

    python scripts/smoke_installed.py DIST...           the wheels alone, without extras
    python scripts/smoke_installed.py --extras DIST...  after the plugins' extras are installed

DIST... are the plugin distributions that `kronk plugins` must list, active. Without
--extras: `kronk --version` and `python -m kronk --version` answer, every module of every
installed kronk distribution imports, and the extras' packages are absent (the plugins work
without them). With --extras: the modules that need them import.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

# Module → the package of the extra it needs: kronk-auth-jwt[redis], kronk-tempo[grpc].
EXTRA_MODULES = {
    "kronk_auth_jwt.redis_store": "redis",
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter": "grpc",
}
# The test harness needs the root's `test` extra (pytest and the rest): its package alone.
HARNESS = "kronk_testing."


def kronk_modules() -> list[str]:
    """Every module of the installed kronk distributions, `__main__` aside (it runs the CLI)."""
    tops = sorted(
        top
        for top, dists in importlib.metadata.packages_distributions().items()
        if all(dist.startswith("kronk") for dist in dists)
    )
    found = []
    for top in tops:
        package = importlib.import_module(top)
        assert Path(package.__path__[0]).is_relative_to(sys.prefix), (top, package.__path__)
        found.append(top)
        for module in pkgutil.walk_packages(package.__path__, prefix=f"{top}."):
            found.append(module.name)
    return [name for name in found if not name.endswith(".__main__")]


def run(*command: str) -> str:
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def main(arguments: list[str]) -> None:
    extras = arguments[:1] == ["--extras"]
    wanted = set(arguments[1:] if extras else arguments)
    if extras:
        for module in EXTRA_MODULES:
            importlib.import_module(module)
        print(f"imported with the extras: {', '.join(EXTRA_MODULES)}")
        return
    for package in set(EXTRA_MODULES.values()):
        assert importlib.util.find_spec(package) is None, f"{package} installed without its extra"
    modules = [
        name
        for name in kronk_modules()
        if name not in EXTRA_MODULES and not name.startswith(HARNESS)
    ]
    for name in modules:
        importlib.import_module(name)
    print(f"imported {len(modules)} modules")
    kronk = shutil.which("kronk", path=Path(sys.executable).parent)
    assert kronk is not None, "no kronk command beside this environment's python"
    version = importlib.metadata.version("kronk")
    for command in ([kronk, "--version"], [sys.executable, "-m", "kronk", "--version"]):
        answer = run(*command).strip()
        assert answer == f"kronk, version {version}", (command, answer)
    plugins = json.loads(run(kronk, "plugins", "--json"))
    listed = {plugin["distribution"].split()[0] for plugin in plugins if plugin["active"]}
    assert listed == wanted, (sorted(listed), sorted(wanted))
    print(f"kronk {version}; kronk plugins lists {len(listed)} plugins, all active")


if __name__ == "__main__":
    main(sys.argv[1:])
