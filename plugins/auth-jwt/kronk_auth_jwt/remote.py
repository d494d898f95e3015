"""auth-jwt.host (the manual's --auth-host): another Kronk server checks this server's tokens.

Replicas behind a balancer then share one set of keys, one issuer and one set of rate-limit
counters: the auth service's. Each request's credentials go to the service's
`POST /v1/kronk/security/authenticate` with the endpoint it calls; the service answers who
the token belongs to, or the 401, 403 or 429 it would have answered itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Annotated

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kronk_api.contract import Checked
from kronk_auth_jwt.tokens import MAX_SUBJECT_CHARS
from kronk_core.contract import (
    AuthenticationError,
    KronkError,
    PermissionDeniedError,
    RateLimitError,
    UnavailableError,
)

log = logging.getLogger(__name__)

AUTHENTICATE_PATH = "/v1/kronk/security/authenticate"
TIMEOUT_SECONDS = 10.0


class CheckAnswer(BaseModel):
    """The service's 200, parsed strictly: `"admin": "false"` or `1` is no answer at all,
    never a boolean by conversion."""

    model_config = ConfigDict(extra="ignore", strict=True)

    subject: Annotated[str, Field(min_length=1, max_length=MAX_SUBJECT_CHARS)]
    admin: bool


def _message(response: httpx.Response) -> str:
    """The service's own error message (any dialect's shape), else its status."""
    try:
        error = response.json().get("error")
    except ValueError:
        error = None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    return f"status {response.status_code}"


class RemoteAuthenticator:
    """A TokenChecker that asks the auth service."""

    def __init__(self, host: str, timeout: float = TIMEOUT_SECONDS) -> None:
        base = host if "://" in host else f"http://{host}"
        self.url = base.rstrip("/") + AUTHENTICATE_PATH
        self._client = httpx.AsyncClient(timeout=timeout)

    async def check(self, credentials: str | None, endpoint: str, times: int = 1) -> Checked:
        headers = {"authorization": credentials} if credentials else {}
        try:
            response = await self._client.post(
                self.url, json={"endpoint": endpoint, "times": times}, headers=headers
            )
        except httpx.HTTPError as exc:
            raise UnavailableError(
                f"the auth service at {self.url} did not answer ({type(exc).__name__}); retry later"
            ) from None
        if response.status_code == 200:
            try:
                answer = CheckAnswer.model_validate_json(response.content)
            except ValidationError as exc:
                # Fail closed: a service that answers out of shape is a broken service.
                log.warning(
                    "the auth service at %s answered a check out of shape (%s): refused",
                    self.url,
                    "; ".join(
                        f"{'.'.join(map(str, error['loc'])) or 'body'}: {error['msg']}"
                        for error in exc.errors()
                    ),
                )
                raise UnavailableError(
                    f"the auth service at {self.url} answered nonsense"
                ) from None
            return Checked(answer.subject, answer.admin)
        raise _error(response, self.url)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # no running loop: the process is ending
            asyncio.get_running_loop().create_task(self._client.aclose())


def _error(response: httpx.Response, url: str) -> KronkError:
    message = _message(response)
    if response.status_code == 401:
        return AuthenticationError(message)
    if response.status_code == 403:
        return PermissionDeniedError(message)
    if response.status_code == 429:
        retry = response.headers.get("retry-after", "")
        return RateLimitError(message, retry_after=int(retry) if retry.isdigit() else 1)
    return UnavailableError(f"the auth service at {url} answered {response.status_code}: {message}")
