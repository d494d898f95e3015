"""Which conversations the host tier keeps in RAM when they do not all fit.

Evicting the least recently used (`Placement.recent`) suits a person going back to recent
chats. For agents that take turns in a cycle longer than the tier holds it is the worst
choice: the conversation it evicts is always the next one back, and no turn is restored.
`Placement.keep` keeps what the tier holds instead: a conversation never restored from it
goes in first in line to leave (one put in KEEP_CHURN goes in last, so that what is kept
still changes), a restored one and its continuation last; the older version of a
conversation that went on leaves first. It restores a steady share of such a fleet, and
fewer recent chats.

`Duel` says which of the two the tier follows, from what each would have restored on the
same traffic: both are simulated on the conversations' tokens and sizes alone (set
dueling, after Qureshi et al., "Adaptive insertion policies for high performance caching",
ISCA 2007); the tier switches to the other one once it would have restored half as often
again over about the last ten lookups.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from kronk_core.contract import common_prefix

if TYPE_CHECKING:
    from kronk_caching.host_store import StoredConversation

    Usable = Callable[[StoredConversation, int], int]

# Each earlier lookup's weight in the restores a placement would have made falls by this
# (about the last ten count): traffic changes its pattern, and a tier must follow soon.
DECAY = 0.9
# The placement not followed must have restored this many times as often to be followed.
SWITCH_MARGIN = 1.5
# Under `keep`, every this many puts, one that is not a continuation goes in last in line.
KEEP_CHURN = 32


class Placement(StrEnum):
    recent = "recent"
    keep = "keep"


def continued(
    restored: Mapping[bytes, int],
    tokens_of: Callable[[bytes], Sequence[int]],
    tokens: Sequence[int],
) -> list[bytes]:
    """The restored conversations these tokens go on with: each keeps at least the prefix
    its last restore kept (`restored`: key → tokens kept)."""
    return [key for key, kept in restored.items() if common_prefix(tokens_of(key), tokens) >= kept]


def place(
    placement: Placement,
    order: OrderedDict[bytes, Any],
    key: bytes,
    extends: Iterable[bytes],
    churn: bool,
) -> None:
    """Move `key`, just put at the back of `order` (whose front leaves first), where
    `placement` wants it: under `keep` a conversation that continues none of `extends`
    goes to the front (unless `churn`), and the older versions it continues go first."""
    if placement is Placement.recent:
        return
    extends = tuple(extends)
    if not extends and not churn:
        order.move_to_end(key, last=False)
    for other in extends:
        if other != key and other in order:  # not superseded: an older version stays
            order.move_to_end(other, last=False)


@dataclass
class _Shadow:
    """One placement simulated on keys and sizes: what it would hold, and have restored."""

    placement: Placement
    max_bytes: int
    order: OrderedDict[bytes, int] = field(default_factory=OrderedDict)  # key → bytes
    restored: dict[bytes, int] = field(default_factory=dict)
    held: int = 0
    restores: float = 0.0  # decayed

    def put(
        self,
        key: bytes,
        size: int,
        tokens: Sequence[int],
        superseded: Iterable[bytes],
        known: Mapping[bytes, StoredConversation],
        churn: bool,
    ) -> None:
        extends = continued(self.restored, lambda k: known[k].tokens, tokens)
        kept = max((self.restored[k] for k in extends), default=0)
        for other in (*superseded, key):
            self._remove(other)
        self.order[key] = size
        self.held += size
        if kept:
            self.restored[key] = kept
        place(self.placement, self.order, key, extends, churn)
        while self.held > self.max_bytes and self.order:
            self._remove(next(iter(self.order)))

    def lookup(self, keeps: Mapping[bytes, int]) -> None:
        best_keep, best_key = 0, b""
        for key in self.order:
            if keeps[key] and keeps[key] >= best_keep:
                best_keep, best_key = keeps[key], key
        self.restores = self.restores * DECAY + bool(best_keep)
        if best_keep:
            self.order.move_to_end(best_key)
            self.restored[best_key] = best_keep

    def _remove(self, key: bytes) -> None:
        size = self.order.pop(key, None)
        if size is not None:
            self.held -= size
        self.restored.pop(key, None)


class Duel:
    """Both placements simulated on the tier's traffic; `placement` is the one to follow."""

    def __init__(self, max_bytes: int) -> None:
        self._shadows = [_Shadow(placement, max_bytes) for placement in Placement]
        # The stored conversations either simulation holds, without their states.
        self._known: dict[bytes, StoredConversation] = {}
        self._puts = 0
        self._placement = Placement.recent

    @property
    def placement(self) -> Placement:
        """The placement to follow: the other one once it would have restored SWITCH_MARGIN
        times as often (a tier takes a while to hold what its new placement keeps)."""
        recent, keep = self._shadows
        current, other = (keep, recent) if self._placement is Placement.keep else (recent, keep)
        if other.restores > SWITCH_MARGIN * current.restores:
            self._placement = other.placement
        return self._placement

    def churn(self) -> bool:
        """Whether this put is the one in KEEP_CHURN that goes in last under `keep`."""
        self._puts += 1
        return self._puts % KEEP_CHURN == 0

    def put(self, key: bytes, entry: StoredConversation, size: int, churn: bool) -> None:
        """`entry` (its state not needed) of `size` bytes was put; it drops the conversations
        it extends and can be cut back to, as the tier does."""
        dropped = tuple(
            other
            for other, known in self._known.items()
            if entry.tokens[: len(known.tokens)] == known.tokens and entry.keeps(len(known.tokens))
        )
        self._known[key] = entry
        for shadow in self._shadows:
            shadow.put(key, size, entry.tokens, dropped, self._known, churn)
        held = {k for shadow in self._shadows for k in shadow.order}
        for other in [k for k in self._known if k not in held]:
            del self._known[other]

    def lookup(self, prompt: Sequence[int], usable: Usable) -> None:
        """A prompt looked for a stored conversation: what each placement would restore."""
        keeps = {
            key: usable(entry, common_prefix(entry.tokens, prompt))
            for key, entry in self._known.items()
        }
        for shadow in self._shadows:
            shadow.lookup(keeps)
