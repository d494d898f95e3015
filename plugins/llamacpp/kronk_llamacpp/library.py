"""Process-wide llama.cpp set-up: backend init once, its log routed into Python logging."""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import llama_cpp

from kronk_llamacpp import native
from kronk_llamacpp.amx import drop_amx_buffer_type

log = logging.getLogger("kronk.llama")
_lock = threading.Lock()
_initialised = False

# GGML log levels: 1 debug, 2 info, 3 warn, 4 error, 5 continuation.
_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}


# llama.cpp compares the whole KV pool with the training length: with one pool shared by all
# slots (kv_unified) that is no overflow; model.py warns per slot instead.
_POOL_WARNING = b"possible training context overflow"

# The error lines llama.cpp logs on a thread inside `errors_logged`: llama.cpp says why only
# there, where a call it refuses returns NULL.
_captured = threading.local()


@contextmanager
def errors_logged() -> Iterator[list[str]]:
    """The error lines llama.cpp logs on this thread while the block runs."""
    lines: list[str] = []
    _captured.lines = lines
    try:
        yield lines
    finally:
        _captured.lines = None


@llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
def route_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    python_level = _LEVELS.get(level, logging.DEBUG)
    captured = getattr(_captured, "lines", None)
    if captured is not None and python_level == logging.ERROR:
        captured.append(text.decode("utf-8", errors="replace").strip())
    if _POOL_WARNING in text:
        python_level = logging.DEBUG
    if log.isEnabledFor(python_level):
        log.log(python_level, "%s", text.decode("utf-8", errors="replace").rstrip())


def ensure_initialised() -> None:
    global _initialised
    with _lock:
        if _initialised:
            return
        native.load()
        llama_cpp.llama_log_set(route_log, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        drop_amx_buffer_type()
        _initialised = True
