"""Incremental detokenization: whole UTF-8 characters only, stop strings cut exactly."""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class Utf8Stream:
    """Bytes of token pieces in, complete characters out; a split multi-byte char is held."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class StopMatcher:
    """Holds back text that could be the start of a stop string; cuts at the first match."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(stop for stop in stops if stop)
        self._held = ""
        self.matched: str | None = None

    def push(self, text: str) -> str:
        """Add text; return what is safe to emit. After a match, returns text up to it only."""
        if self.matched is not None:
            return ""
        if not self._stops:
            return text
        held = self._held + text
        cut = -1
        for stop in self._stops:
            at = held.find(stop)
            if at != -1 and (cut == -1 or at < cut):
                cut, self.matched = at, stop
        if cut != -1:
            self._held = ""
            return held[:cut]
        keep = self._partial_suffix(held)
        self._held = held[len(held) - keep :]
        return held[: len(held) - keep]

    def flush(self) -> str:
        """End of generation without a match: the held text was never a stop string."""
        held, self._held = self._held, ""
        return "" if self.matched is not None else held

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of text that is a proper prefix of some stop string."""
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest
