"""`kronk run` as a person at a terminal meets it, through a pseudo-terminal: line editing
and history, multi-line messages, /set, /show, /load, /clear and /bye, reasoning shown
apart from the answer, --verbose timings, Ctrl-C stopping an answer (not the session) with
what was typed meanwhile neither echoed nor sent, and answers to the model's natural stop.
Also a prompt on the command line, or piped in, answered once. The model is the scripted
one (kronk_testing.scripted), installed as a plugin of the `kronk` process; files named in a
message go to the tiny generated vision model."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kronk_api.terminal_chat import TerminalChat
from kronk_core import Kronk, KronkConfig
from kronk_testing.agents import scripted_plugin_path
from kronk_testing.media_samples import image, wav
from kronk_testing.plugin import MultimodalPaths
from kronk_testing.scripted import CHATML, Script, write_script
from kronk_testing.terminal import Terminal

KRONK = str(Path(sys.executable).parent / "kronk")
# A reply long enough to stop in the middle: 600 tokens at 50 ms each.
LONG = "Once upon a time " + "and then nothing happened " * 22
SHORT = "Done, and done, and done, and done."
# ChatML with the <think> block a reasoning model's template has: replies are split there.
THINKING_CHATML = CHATML + "{# reasoning models write <think>...</think> first #}"


@pytest.fixture
def setup(tmp_path: Path) -> tuple[list[str], dict[str, str], Path]:
    """The `kronk run` command line (without its model), its environment, its base path."""
    base = tmp_path / "base"
    template = tmp_path / "thinking.jinja"
    template.write_text(THINKING_CHATML, encoding="utf-8")
    fast = Script(
        replies=(
            ("why", "<think>pondering</think>Because."),
            ("first line\nsecond line", "Both lines arrived."),
        ),
    )
    slow = Script(replies=(("briefly", SHORT),), default=LONG, decode_seconds=0.05)
    models = {
        "chat": {
            "backend": "scripted",
            "model_path": str(write_script(tmp_path / "chat.json", fast)),
            "templates": {"template": str(template)},
        },
        "slow": {
            "backend": "scripted",
            "n_seq_max": 1,
            "model_path": str(write_script(tmp_path / "slow.json", slow)),
        },
    }
    config = tmp_path / "models.yaml"
    config.write_text(json.dumps({"models": models}), encoding="utf-8")
    plugin = scripted_plugin_path(tmp_path / "plugin")
    paths = [str(plugin), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {"PYTHONPATH": os.pathsep.join(paths), "KRONK_BASE_PATH": str(base)}
    return [KRONK, "run", "--model-config-file", str(config)], env, base


def test_a_terminal_session(setup: tuple[list[str], dict[str, str], Path]) -> None:
    command, env, base = setup
    with Terminal([*command, "chat"], env=env) as term:
        term.expect(">>> Send a message (/? for help)")
        term.expect(">>> ")  # the prompt
        term.type("hello\n")
        assert "Hello from the scripted model." in term.expect(">>> ")

        # Reasoning apart from the answer, as ollama shows it.
        term.type("why is the sky blue\n")
        shown = term.expect(">>> ")
        assert shown.index("Thinking...") < shown.index("pondering")
        assert shown.index("pondering") < shown.index("...done thinking.") < shown.index("Because.")

        term.type("/set parameter temperature 0.5\n")
        term.expect("Set parameter 'temperature' to '0.5'")
        term.type("/set parameter top_k lots\n")
        term.expect("Couldn't set parameter: 'lots' is not a whole number")
        term.type("/set parameter temperature -1\n")
        term.expect("Couldn't set parameter: temperature")
        term.type("/set parameter num_ctx 8192\n")
        term.expect("Unknown parameter 'num_ctx'")
        term.type("/show parameters\n")
        assert "temperature" in term.expect("0.5")

        term.type('"""first line\n')
        term.expect("... ")
        term.type('second line"""\n')
        assert "Both lines arrived." in term.expect(">>> ")

        term.type("/set verbose\n")
        term.type("hello\n")
        report = term.expect(re.compile(r"eval rate:\s+[\d.]+ tokens/s"))
        assert "time to first token:" in report and "eval count:" in report
        term.type("/set quiet\n")
        term.expect("Set 'quiet' mode.")

        term.type("/clear\n")
        term.expect("Cleared session context")
        term.type("\x1b[A\n")  # the up arrow: the last line again, from readline's history
        term.expect("Cleared session context")
        term.type("/show info\n")
        info = term.expect("input")
        assert "chat" in info and "4096 tokens per slot" in info

        # What is typed during an answer is neither echoed into it nor the next message.
        term.type("/load slow\n")
        term.expect("Loaded slow.")
        term.type("answer briefly\n")
        term.expect("Done,")
        term.type("typed during the answer")
        assert term.expect(">>> ").startswith(SHORT.removeprefix("Done,") + "\n")
        term.type("/show system\n")
        term.expect("No system message was specified.")
        assert "typed during the answer" not in term.screen

        # Ctrl-C stops an answer, and the session goes on.
        term.type("/clear\n")
        term.expect("Cleared session context")
        term.type("tell me a story\n")
        term.expect("Once upon a time")
        term.interrupt()
        term.expect(">>> ")
        term.type("/show system\n")
        term.expect("No system message was specified.")
        assert LONG.strip() not in term.screen

        # At the prompt (once it is there: a signal before the read would stop the last
        # command instead), the session goes on.
        term.expect(">>> ")
        term.interrupt()
        term.expect("Use Ctrl + d or /bye to exit.")
        term.type("/bye\n")
        assert term.wait() == 0
    assert "hello" in (base / "history").read_text()


def test_a_prompt_given_or_piped_is_answered_once(
    setup: tuple[list[str], dict[str, str], Path],
) -> None:
    command, env, _ = setup
    environ = {**os.environ, **env}
    given = subprocess.run(
        [*command, "chat", "hello", "there"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert given.returncode == 0, given.stderr
    assert given.stdout.strip() == "Hello from the scripted model."
    piped = subprocess.run(
        [*command, "chat"], env=environ, capture_output=True, text=True, timeout=120, input="why?\n"
    )
    assert piped.returncode == 0, piped.stderr
    # No terminal: no colours, the same words.
    assert piped.stdout.split() == ["Thinking...", "pondering", "...done", "thinking.", "Because."]


def test_files_named_in_a_message_go_to_a_model_that_reads_them(
    multimodal_paths: MultimodalPaths, tmp_path: Path
) -> None:
    """`describe ./cat.png`: the image goes with the message, said as it is added; a sound to
    a model without an audio projector, or any file to a text model, stays words."""
    picture, sound = tmp_path / "cat.png", tmp_path / "purr.wav"
    picture.write_bytes(image((200, 100, 50)))
    sound.write_bytes(wav(440.0))
    settings = {"templates": {"template": "gemma"}, "context_window": 2048, "n_seq_max": 1}
    models = {
        "vision": {
            **settings,
            "model_path": multimodal_paths.model,
            "projector_path": multimodal_paths.vision,
        },
        "text": {**settings, "model_path": multimodal_paths.model},
    }
    config = KronkConfig.model_validate({"base_path": tmp_path, "models": models})
    with Kronk(config) as kronk:
        shown = io.StringIO()
        chat = TerminalChat(kronk, "vision", out=shown, parameters={"max_tokens": 3})
        content = chat.content_of(f"describe {picture} and {sound}")
        assert content == [f"describe and {sound}", {"type": "image", "path": str(picture)}]
        assert shown.getvalue() == f"Added image '{picture}'\n"
        chat.ask(f"what is in {picture}")
        assert chat.history[0]["content"][1] == {"type": "image", "path": str(picture)}
        assert chat.history[1]["role"] == "assistant" and "Error" not in shown.getvalue()
        text_only = TerminalChat(kronk, "text", out=io.StringIO())
        assert text_only.content_of(f"describe {picture}") == f"describe {picture}"
