"""`kronk run`: a chat with a model in the terminal, as `ollama run` has it.

Line editing and history (readline, kept in <base>/history), multi-line input between
`\"\"\"` marks, `/set`, `/show`, `/load`, `/clear`, `/bye`; reasoning shown apart from the
answer; `--verbose` timings; image and sound files named by path for models that read
them. Ctrl-C stops an answer, not the session; what is typed during an answer is neither
echoed into it nor taken as the next question. Answers run to the model's natural stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from kronk_core import Kronk
from kronk_core.contract.errors import KronkError
from kronk_core.contract.media import MediaKind
from kronk_core.inputs import chat_request

# Ollama's parameter names and what each is in a Kronk request.
PARAMETERS: Mapping[str, tuple[str, type]] = {
    "temperature": ("temperature", float),
    "top_k": ("top_k", int),
    "top_p": ("top_p", float),
    "min_p": ("min_p", float),
    "typical_p": ("typical_p", float),
    "seed": ("seed", int),
    "repeat_penalty": ("repeat_penalty", float),
    "repeat_last_n": ("repeat_last_n", int),
    "presence_penalty": ("presence_penalty", float),
    "frequency_penalty": ("frequency_penalty", float),
    "mirostat": ("mirostat", int),
    "mirostat_tau": ("mirostat_tau", float),
    "mirostat_eta": ("mirostat_eta", float),
    "num_predict": ("max_tokens", int),
    "max_tokens": ("max_tokens", int),
    "stop": ("stop", str),
}
_KINDS = {int: "a whole number", float: "a number", str: "text"}
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp"})
SOUND_SUFFIXES = frozenset({".wav", ".mp3", ".flac"})
MULTILINE = '"""'
HISTORY_LINES = 1000

HELP = """Available commands:
  /set parameter NAME VALUE   Set a sampling parameter (/show parameters lists them)
  /set system TEXT            Set the system message
  /set think | nothink        Ask for reasoning, or not (models that reason)
  /set verbose | quiet        Show timings after each answer, or not
  /show info | parameters | system | template
  /load MODEL                 Switch to another model (the conversation starts over)
  /clear                      Forget the conversation so far
  /bye                        Exit (also /exit, /quit, Ctrl-D)
  /?, /help                   This help

Start and end a message of several lines with \"\"\".
Name an image or sound file by its path in a message to a model that reads them.
Ctrl-C stops an answer; Ctrl-D or /bye exits."""

DIM, RESET = "\x1b[2m", "\x1b[0m"


@dataclass
class Turn:
    """What one answer took: for `--verbose`."""

    started: float
    first_token: float | None = None
    finished: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    def report(self) -> str:
        total = self.finished - self.started
        first = (self.first_token or self.finished) - self.started
        generating = max(self.finished - (self.first_token or self.finished), 1e-9)
        new_prompt = self.prompt_tokens - self.cached_tokens
        rows = [
            ("total duration", f"{total:.3f}s"),
            ("time to first token", f"{first:.3f}s"),
            ("prompt eval count", f"{self.prompt_tokens} token(s), {self.cached_tokens} cached"),
            ("prompt eval rate", f"{new_prompt / max(first, 1e-9):.2f} tokens/s"),
            ("eval count", f"{self.completion_tokens} token(s)"),
            ("eval duration", f"{generating:.3f}s"),
            ("eval rate", f"{max(self.completion_tokens - 1, 0) / generating:.2f} tokens/s"),
        ]
        return "\n".join(f"{name + ':':<22}{value}" for name, value in rows)


@dataclass
class TerminalChat:
    """One `kronk run` session; `out` is the terminal (or a pipe: then no colours)."""

    kronk: Kronk
    model_id: str
    out: TextIO = sys.stdout
    verbose: bool = False
    parameters: dict[str, Any] = field(default_factory=dict)
    system: str | None = None
    think: bool | None = None
    history: list[dict[str, Any]] = field(default_factory=list)

    # ---- one message ------------------------------------------------------------------

    def ask(self, text: str) -> None:
        """Send a message and stream the answer; Ctrl-C stops the answer."""
        content = self.content_of(text)
        self.history.append({"role": "user", "content": content})
        turn = Turn(time.monotonic())
        answer: list[str] = []
        try:
            with _quiet_keyboard():
                asyncio.run(self._stream(answer, turn))
        except KeyboardInterrupt:
            self._write("\n")
        except KronkError as exc:
            self._write(f"\nError: {exc.message}\n")
            self.history.pop()
            return
        turn.finished = time.monotonic()
        # What was said stays in the conversation, all of it or up to the interruption.
        self.history.append({"role": "assistant", "content": "".join(answer)})
        if self.verbose:
            self._write(turn.report() + "\n")

    async def _stream(self, answer: list[str], turn: Turn) -> None:
        messages = [*self._system(), *self.history]
        params = {**self.parameters, "model": self.model_id, "enable_thinking": self.think}
        thinking = False
        async for delta in self.kronk.chat_stream(messages, **params):
            if (delta.reasoning or delta.content) and turn.first_token is None:
                turn.first_token = time.monotonic()
            if delta.reasoning:
                if not thinking:
                    self._write(self._dim("Thinking...\n"))
                    thinking = True
                self._write(self._dim(delta.reasoning))
            if delta.content:
                if thinking:
                    self._write(self._dim("\n...done thinking.\n\n"))
                    thinking = False
                answer.append(delta.content)
                self._write(delta.content)
            if delta.usage is not None:
                turn.prompt_tokens = delta.usage.prompt_tokens
                turn.cached_tokens = delta.usage.cached_tokens
                turn.completion_tokens = delta.usage.completion_tokens
        if thinking:
            self._write(self._dim("\n...done thinking.\n"))
        self._write("\n\n" if answer else "\n")

    def content_of(self, text: str) -> str | list[Any]:
        """The message's content: its text, and the image and sound files it names by path
        when the model reads them (each said as it is added)."""
        media = self.kronk.models.media(self.model_id)
        if not media:
            return text
        words, files = [], []
        for word in _words(text):
            path = Path(word).expanduser()
            kind = _media_kind(path)
            if kind is not None and kind in media and path.is_file():
                files.append({"type": kind.value, "path": str(path)})
                self._write(f"Added {kind.value} '{word}'\n")
            else:
                words.append(word)
        return [" ".join(words), *files] if files else text

    # ---- commands ---------------------------------------------------------------------

    def command(self, line: str) -> bool:
        """Run a /command; False when the session ends."""
        name, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        if name in ("/bye", "/exit", "/quit"):
            return False
        if name in ("/?", "/help"):
            self._write(HELP + "\n")
        elif name == "/clear":
            self.history.clear()
            self._write("Cleared session context\n")
        elif name == "/set":
            self._set(rest)
        elif name == "/show":
            self._show(rest)
        elif name == "/load":
            self._load(rest)
        else:
            self._write(f"Unknown command '{name}'. Type /? for help\n")
        return True

    def _set(self, rest: str) -> None:
        what, _, value = rest.partition(" ")
        value = value.strip()
        if what == "parameter":
            self._set_parameter(value)
        elif what == "system" and value:
            self.system = value
            self._write("Set system message.\n")
        elif what in ("verbose", "quiet"):
            self.verbose = what == "verbose"
            self._write(f"Set '{what}' mode.\n")
        elif what in ("think", "nothink"):
            self.think = what == "think"
            self._write(f"Set '{what}' mode.\n")
        else:
            self._write(
                "Usage: /set parameter NAME VALUE | system TEXT | think | nothink | "
                "verbose | quiet\n"
            )

    def _set_parameter(self, text: str) -> None:
        name, _, raw = text.partition(" ")
        raw = raw.strip()
        if name not in PARAMETERS or not raw:
            known = ", ".join(PARAMETERS)
            self._write(f"Unknown parameter '{name}': one of {known}, and a value\n")
            return
        key, kind = PARAMETERS[name]
        try:
            value: Any = kind(raw)
            # The same checks a request gets, now rather than at the next message.
            chat_request([{"role": "user", "content": "-"}], **{**self.parameters, key: value})
        except ValueError:
            self._write(f"Couldn't set parameter: '{raw}' is not {_KINDS[kind]}\n")
            return
        except KronkError as exc:
            self._write(f"Couldn't set parameter: {exc.message}\n")
            return
        self.parameters[key] = value
        self._write(f"Set parameter '{name}' to '{raw}'\n")

    def _show(self, what: str) -> None:
        if what == "parameters":
            lines = [f"{name:<20}{value}" for name, value in self.parameters.items()]
            self._write(
                "\n".join(["Parameters set in this session:", *lines]) + "\n"
                if lines
                else "No parameters set in this session.\n"
            )
        elif what == "system":
            self._write((self.system or "No system message was specified.") + "\n")
        elif what == "info":
            self._write(self._info() + "\n")
        elif what == "template":
            loaded = self.kronk.get_loaded(self.model_id)
            template = loaded.info.chat_template if loaded is not None else None
            self._write((template or "No chat template in the model's file.") + "\n")
        else:
            self._write("Usage: /show info | parameters | system | template\n")

    def _info(self) -> str:
        rows = [("model", self.model_id)]
        facts = self.kronk.models.facts(self.model_id)
        if facts is not None:
            rows += [
                ("architecture", facts.architecture),
                ("parameters", f"{facts.parameters / 1e6:.1f}M"),
                ("quantization", facts.quantization),
                ("context length", f"{facts.context_length} (trained)"),
            ]
        loaded = self.kronk.get_loaded(self.model_id)
        if loaded is not None:
            rows.append(("context window", f"{loaded.info.n_ctx_per_seq} tokens per slot"))
        media = self.kronk.models.media(self.model_id)
        rows.append(("input", ", ".join(["text", *sorted(kind.value for kind in media)])))
        return "\n".join(f"  {name:<16}{value}" for name, value in rows)

    def _load(self, name: str) -> None:
        if not name:
            self._write("Usage: /load MODEL\n")
            return
        try:
            model_id = self.kronk.models.resolve(name, pull=True)
            self.kronk.load(model_id)
        except KronkError as exc:
            self._write(f"Couldn't load {name}: {exc.message}\n")
            return
        self.model_id = model_id
        self.history.clear()
        self._write(f"Loaded {model_id}.\n")

    # ---- output -----------------------------------------------------------------------

    def _system(self) -> list[dict[str, Any]]:
        return [] if self.system is None else [{"role": "system", "content": self.system}]

    def _dim(self, text: str) -> str:
        return f"{DIM}{text}{RESET}" if self.out.isatty() else text

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()


def read_message(prompt: str = ">>> ") -> str:
    """One message from the terminal: a line, or the lines between \"\"\" marks. EOFError at
    Ctrl-D; KeyboardInterrupt (Ctrl-C) drops what was being typed."""
    line = input(prompt)
    if not line.lstrip().startswith(MULTILINE):
        return line
    text = line.lstrip()[len(MULTILINE) :]
    lines = []
    while not text.rstrip().endswith(MULTILINE):
        lines.append(text)
        text = input("... ")
    lines.append(text.rstrip()[: -len(MULTILINE)])
    return "\n".join(lines).strip("\n")


def interactive(chat: TerminalChat, history_file: Path | None) -> None:
    """The read-answer loop of a terminal session."""
    with _line_history(history_file):
        chat.out.write(">>> Send a message (/? for help)\n")
        while True:
            try:
                message = read_message()
            except EOFError:
                chat.out.write("\n")
                return
            except KeyboardInterrupt:
                chat.out.write("\nUse Ctrl + d or /bye to exit.\n")
                continue
            if not message.strip():
                continue
            if message.startswith("/"):
                if not chat.command(message):
                    return
                continue
            chat.ask(message)


@contextlib.contextmanager
def _line_history(path: Path | None) -> Iterator[None]:
    """readline's editing for input(), and its history kept in `path` between sessions."""
    try:
        import readline
    except ImportError:  # no readline (Windows): plain input()
        yield
        return
    if path is not None:
        with contextlib.suppress(OSError):
            readline.read_history_file(path)
    readline.set_history_length(HISTORY_LINES)
    try:
        yield
    finally:
        if path is not None:
            with contextlib.suppress(OSError):
                path.parent.mkdir(parents=True, exist_ok=True)
                readline.write_history_file(path)


@contextlib.contextmanager
def _quiet_keyboard() -> Iterator[None]:
    """While an answer streams: keys typed are not echoed into it (Ctrl-C still stops it),
    and are dropped afterwards rather than sent as the next message."""
    if not sys.stdin.isatty():
        yield
        return
    import termios

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    quiet = termios.tcgetattr(fd)
    quiet[3] &= ~(termios.ECHO | termios.ICANON)
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcflush(fd, termios.TCIFLUSH)
        termios.tcsetattr(fd, termios.TCSANOW, saved)


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote: plain words
        return text.split()


def _media_kind(path: Path) -> MediaKind | None:
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return MediaKind.image
    if suffix in SOUND_SUFFIXES:
        return MediaKind.audio
    return None
