"""What clients may read of an error: server-side details stay in the server's log."""

from __future__ import annotations

import logging

from kronk_core.contract.errors import KronkError

log = logging.getLogger(__name__)


def client_message(error: KronkError) -> str:
    """The error's message, except for a 500: its code only, the message being logged.

    A 500's message is about the server's insides (model paths, configuration);
    a 503 only says the server is going away or a dependency is down.
    """
    if error.status != 500:
        return error.message
    log.error("%s: %s", error.code, error.message)
    return f"{error.code}: the server could not serve this request; see its log"
