"""What clients may read of an error: server-side details stay in the server's log."""

from __future__ import annotations

import logging

from kronk_core.errors import KronkError

log = logging.getLogger(__name__)


def client_message(error: KronkError) -> str:
    """The error's message for a 4xx; for a 5xx, its code only, the message being logged.

    A 5xx message is about the server (model paths, configuration), not the request.
    """
    if error.status < 500:
        return error.message
    log.error("%s: %s", error.code, error.message)
    return f"{error.code}: the server could not serve this request; see its log"
