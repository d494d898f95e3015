"""`kronk run`: chat with a model in the terminal, without a server."""

from __future__ import annotations

import contextlib
import itertools
import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from kronk_api.cli.common import base_path_option, fail, local_config, model_config_option
from kronk_api.terminal_chat import TerminalChat, interactive
from kronk_core import Kronk
from kronk_core.contract.errors import KronkError


@click.command("run")
@click.argument("model_id", required=False)
@click.argument("prompt", nargs=-1)
@base_path_option
@model_config_option
@click.option("--verbose", is_flag=True, help="Show timings after each answer")
@click.option("--system", default=None, help="The system message")
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=None,
    envvar="KRONK_MAX_TOKENS",
    help="Stop an answer after this many tokens [the model's natural stop]",
)
@click.option("--temperature", type=float, default=None, envvar="KRONK_TEMPERATURE")
def run(
    model_id: str | None,
    prompt: tuple[str, ...],
    base_path: Path | None,
    model_config_file: Path | None,
    verbose: bool,
    system: str | None,
    max_tokens: int | None,
    temperature: float | None,
) -> None:
    """Chat with a model in the terminal (no server needed), as `ollama run`: /? lists the
    commands, Ctrl-C stops an answer, Ctrl-D or /bye quits.

    MODEL_ID may be a model file's path (`./x.gguf`) or a reference a plugin can pull
    (`org/repo:Q4_K_M`, pulled first). With a PROMPT, or a message piped in, it answers
    that and exits.
    """
    # llama.cpp's load chatter would interleave with the conversation.
    logging.getLogger("kronk.llama").setLevel(logging.ERROR)
    try:
        config = local_config(base_path, model_config_file, model_id)
        kronk = Kronk(config)
        with _progress_lines():
            model_id = kronk.models.resolve(model_id, pull=True)
        with _spinner(f"loading {model_id}"):
            kronk.load(model_id)
    except KronkError as exc:
        fail(exc)
    parameters: dict[str, Any] = {}
    if max_tokens is not None:
        parameters["max_tokens"] = max_tokens
    if temperature is not None:
        parameters["temperature"] = temperature
    chat = TerminalChat(kronk, model_id, verbose=verbose, parameters=parameters, system=system)
    try:
        if prompt or not sys.stdin.isatty():
            chat.ask(" ".join(prompt) if prompt else sys.stdin.read())
        else:
            interactive(chat, config.base_path / "history")
    finally:
        kronk.close()


@contextlib.contextmanager
def _progress_lines() -> Iterator[None]:
    """Show what the plugins log meanwhile (a pull's progress), as plain lines on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


class _spinner:
    """A spinner on stderr while something slow (a model load) runs."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        for frame in itertools.cycle("|/-\\"):
            if self._done.wait(0.1):
                break
            click.echo(f"\r{frame} {self._label}", nl=False, err=True)
        click.echo("\r" + " " * (len(self._label) + 2) + "\r", nl=False, err=True)

    def __enter__(self) -> _spinner:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()
