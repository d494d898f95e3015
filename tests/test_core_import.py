"""The core imports and works with llama-cpp-python absent."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_core_imports_without_llama_cpp() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["llama_cpp"] = None  # any import of it now raises ImportError
        import kronk_core, kronk_core.engine, kronk_core.sdk, kronk_core.hookspecs
        from kronk_core import Kronk, KronkConfig
        from kronk_core.config import PluginSelection
        kronk = Kronk(KronkConfig(plugins=PluginSelection(disabled=["llamacpp"])))
        assert kronk.model_ids()
        assert "llama_cpp" not in {name for name in sys.modules if sys.modules[name]}
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
