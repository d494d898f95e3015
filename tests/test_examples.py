"""Every example runs as printed."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from kronk_testing.answers import assert_english_about_the_sea

# The example chats with the default model, the llamacpp plugin's.
pytestmark = pytest.mark.needs_plugins

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_sdk_chat_example_runs(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "sdk_chat.py")],
        capture_output=True,
        text=True,
        timeout=180,
        env={"KRONK_BASE_PATH": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
    )
    assert result.returncode == 0, result.stderr
    assert "[length, 48 tokens]" in result.stdout or "[stop," in result.stdout
    whole = result.stdout.split("whole answer: ", 1)[1].strip()
    assert_english_about_the_sea(ast.literal_eval(whole))  # the default model follows it
