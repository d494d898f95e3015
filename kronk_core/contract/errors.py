"""The one error hierarchy. Each API dialect maps these to its own HTTP shape in one place."""

from __future__ import annotations


class KronkError(Exception):
    """Base of every error Kronk raises on purpose. `status` is the HTTP status it maps to."""

    status: int = 500
    code: str = "internal"
    # Seconds a client should wait before retrying (the Retry-After header), if it should.
    retry_after: int | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequestError(KronkError):
    """The request is malformed or a value is out of range."""

    status = 400
    code = "invalid_argument"


class ContextOverflowError(InvalidRequestError):
    """Prompt plus max_tokens do not fit in the model's context window."""

    code = "context_length_exceeded"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        prompt_tokens: int | None = None,
        context_window: int | None = None,
    ) -> None:
        super().__init__(message, param=param)
        # The counts, for dialects whose clients read them from their own wording.
        self.prompt_tokens = prompt_tokens
        self.context_window = context_window


class LimitExceededError(InvalidRequestError):
    """The request is past a configured limit; the message names the setting that raises it."""

    code = "limit_exceeded"


class RequestTimeoutError(KronkError):
    """The client did not send its request within the server's read timeout."""

    status = 408
    code = "request_timeout"


class NotFoundError(KronkError):
    """The thing a request names (a stored response, ...) does not exist."""

    status = 404
    code = "not_found"


class ModelNotFoundError(NotFoundError):
    """No configured or installed model has that id."""

    code = "model_not_found"


class ModelLoadedError(KronkError):
    """A model to delete is loaded and the request did not ask to unload it first."""

    status = 409
    code = "model_loaded"


class ConfigError(KronkError):
    """A configuration value is invalid; the message names the key."""

    status = 500
    code = "config_error"

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}", param=key)
        self.key = key


class ModelLoadError(KronkError):
    """A model could not be loaded (file missing, unsupported, out of memory)."""

    status = 500
    code = "model_load_failed"


class InsufficientMemoryError(ModelLoadError):
    """The model would not fit the memory its device has free: refused before loading."""

    status = 503  # free memory changes as other models unload; the message says what to lower
    code = "insufficient_memory"


class BackendUnavailableError(ModelLoadError):
    """A device the model is placed on cannot be reached now (a llama.cpp RPC worker that is
    down or serving another client): the load is refused; it may succeed once it runs."""

    status = 503
    code = "backend_unavailable"


class TemplateError(InvalidRequestError):
    """The chat template failed to render these messages."""

    code = "template_error"


class MediaError(InvalidRequestError):
    """An image or sound that cannot be read: not base64, an unknown format, undecodable."""

    code = "invalid_media"


class MediaLimitError(InvalidRequestError):
    """Media past a configured limit (media max_bytes, max_items, max_pixels)."""

    code = "media_limit_exceeded"


class RequestTooLargeError(KronkError):
    """The request body is larger than the server accepts."""

    status = 413
    code = "request_too_large"


class AuthenticationError(KronkError):
    """No valid credentials: the bearer token is missing, malformed, forged, expired or foreign."""

    status = 401
    code = "invalid_token"


class PermissionDeniedError(KronkError):
    """Valid credentials that do not grant this endpoint."""

    status = 403
    code = "permission_denied"


class TooManyRequestsError(KronkError):
    """Base of the 429s: the client should retry after `retry_after` seconds."""

    status = 429
    code = "too_many_requests"

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QueueFullError(TooManyRequestsError):
    """The model's request queue stayed full past the caller's wait."""

    code = "queue_full"


class RateLimitError(TooManyRequestsError):
    """The token's quota for this endpoint is used up until its window ends."""

    code = "rate_limit_exceeded"


class UnavailableError(KronkError):
    """Something the request needs cannot answer now (a service, a shut-down engine)."""

    status = 503
    code = "unavailable"


class EngineClosedError(UnavailableError):
    """The engine was shut down while the request was queued or running."""


class BackendLostError(UnavailableError):
    """A device the model runs on is gone (a llama.cpp RPC worker stopped): its engine stops,
    and the model cannot run again in this process."""

    code = "backend_lost"


class KVCacheFullError(KronkError):
    """The KV cache has no room for a request's next tokens now; other requests free some."""

    status = 503
    code = "kv_cache_full"
    retry_after = 1


class CapabilityError(InvalidRequestError):
    """The model cannot do what the request asks (chat on an embedding model, and so on)."""

    code = "model_not_supported"


class PoolBusyError(QueueFullError):
    """Every place in the model pool holds a model with active requests, past the caller's wait."""

    status = 503
    code = "model_pool_busy"
