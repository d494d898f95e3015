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
        import kronk_core, kronk_core.runtime.engine, kronk_core.sdk, kronk_core.contract.hookspecs
        from kronk_core import Kronk, KronkConfig, ModelConfig
        from kronk_core.contract.selection import PluginSelection
        from kronk_core.contract.errors import ConfigError
        models = {"m": ModelConfig(model_path="/m.gguf")}
        kronk = Kronk(KronkConfig(plugins=PluginSelection(disabled=["llamacpp"]), models=models))
        assert kronk.models.ids() == ["m"]
        try:
            kronk.models.default
        except ConfigError as exc:  # the default model is a backend plugin's
            assert "no active plugin ships a default model" in str(exc), exc
        else:
            raise AssertionError("a default model without a backend")
        assert "llama_cpp" not in {name for name in sys.modules if sys.modules[name]}
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
