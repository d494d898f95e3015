"""The llamacpp plugin's operator route: `GET /v1/kronk/libs`, the Kronk manual's view of
llama.cpp's libraries (which build this server loaded, and what `kronk libs` installed)."""

from __future__ import annotations

import json
import platform
import sys
from importlib.metadata import version
from typing import Any

from litestar import get

from kronk_api.contract import ADMIN, ENDPOINT_OPT
from kronk_llamacpp import native
from kronk_llamacpp.libs import DISTRIBUTION


def installed_builds() -> list[dict[str, Any]]:
    """Each build `kronk libs` installed under the libraries folder: its manifest and folder."""
    root = native.libraries_root()
    found = []
    for processor in native.PROCESSORS:
        folder = root / processor
        try:
            manifest = json.loads((folder / native.MANIFEST).read_text())
        except (OSError, ValueError):
            continue
        if native.library_file(folder).is_file():
            found.append({**manifest, "directory": str(folder)})
    return found


@get("/v1/kronk/libs", opt={ENDPOINT_OPT: ADMIN}, sync_to_thread=True)
def libs() -> dict[str, Any]:
    """The llama.cpp libraries this server runs on, and the builds `kronk libs` installed
    (admin)."""
    loaded = native.load()
    return {
        "status": "retrieve",
        "arch": platform.machine(),
        "os": sys.platform,
        # None: not a `kronk libs` build (llama-cpp-python's wheel, or LLAMA_CPP_LIB_PATH).
        "processor": loaded.processor,
        "current": version(DISTRIBUTION),
        "directory": str(loaded.directory),
        "libraries_path": str(native.libraries_root()),
        "installed": installed_builds(),
    }
