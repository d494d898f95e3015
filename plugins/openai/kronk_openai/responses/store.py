"""Responses this server stored, for previous_response_id and GET /v1/responses/{id}.

With authentication on, a stored response belongs to the token's subject: another
caller gets the same 404 as for an id that does not exist.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from kronk_core.contract import ChatMessage, NotFoundError

# Responses kept, least recently used dropped first: bounded memory, like a cache.
STORE_CAPACITY = 1000


@dataclass(frozen=True, slots=True)
class StoredResponse:
    body: dict[str, Any]
    # The whole conversation, the response's own output last, without instructions.
    conversation: tuple[ChatMessage, ...]
    owner: str | None = None  # the token's subject; None with authentication off


class ResponseStore:
    def __init__(self, capacity: int = STORE_CAPACITY) -> None:
        self._capacity = capacity
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, response_id: str, stored: StoredResponse) -> None:
        self._items[response_id] = stored
        self._items.move_to_end(response_id)
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)

    def get(
        self, response_id: str, owner: str | None, param: str = "previous_response_id"
    ) -> StoredResponse:
        stored = self._items.get(response_id)
        if stored is None or stored.owner != owner:
            raise NotFoundError(f"no stored response with id {response_id!r}", param=param)
        self._items.move_to_end(response_id)
        return stored

    def delete(self, response_id: str, owner: str | None, param: str) -> None:
        self.get(response_id, owner, param)
        del self._items[response_id]
