"""The engine's media thread: runs a model's projector over media chunks, one at a time.

Encoding an image is one call that cannot be split (the vision tower sees the whole
image), so it runs beside the engine thread: other slots go on decoding meanwhile, and
the engine decodes the embeddings into the slot's sequence within its steps, bounded
by the step's prompt budget like any prompt chunk.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from kronk_core.contract.backend import MediaModel
from kronk_core.contract.errors import KronkError
from kronk_core.contract.media import MediaSpan

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Encoding:
    """One media chunk's embeddings, once the media thread has computed them.

    The engine thread reads `done` and then `embeddings` or `error`; setting
    `cancelled` makes the media thread skip it if it has not started.
    """

    span: MediaSpan
    done: bool = False
    cancelled: bool = False
    embeddings: object | None = field(default=None, repr=False)
    error: KronkError | None = None


class MediaEncoder:
    """One thread per model with a projector; `wake` is called when an encoding is done."""

    def __init__(self, model: MediaModel, wake: Callable[[], None]) -> None:
        self._model = model
        self._wake = wake
        self._queue: queue.SimpleQueue[Encoding | None] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._run, name=f"kronk-media-{model.info.id}", daemon=True
        )
        self._thread.start()

    def submit(self, span: MediaSpan) -> Encoding:
        encoding = Encoding(span)
        self._queue.put(encoding)
        return encoding

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (encoding := self._queue.get()) is not None:
            if encoding.cancelled:
                continue
            try:
                encoding.embeddings = self._model.encode_media(encoding.span)
            except KronkError as exc:
                encoding.error = exc
            except Exception:
                log.exception("encoding a media chunk failed on %s", self._model.info.id)
                encoding.error = KronkError(
                    "the projector failed to encode an image or sound; see the server log"
                )
            encoding.done = True
            self._wake()
