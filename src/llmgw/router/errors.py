"""What the router answers when it does not relay an engine's answer.

Each class is one situation a client can be in, with the HTTP status and the
OpenAI error ``type`` and ``code`` it is answered with; the docstring's first
line is the message when the raiser gives none.  The dispatcher raises the
admission ones (by failing the Deferred of ``admit``); the request path raises
the rest.  One function, ``error_body``, turns any of them into OpenAI's error
shape, ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import math


class RouterError(Exception):
    """The router could not answer this request."""

    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str | None = None, *, param: str | None = None):
        self.message = message or (self.__doc__ or "").strip().split("\n")[0]
        self.param = param
        super().__init__(self.message)

    @property
    def headers(self) -> tuple[tuple[str, str], ...]:
        """Extra response header fields, as (name, value)."""
        return ()


class _RetryLater(RouterError):
    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str | None = None, *, retry_after_s: float = 1.0, param: str | None = None):
        super().__init__(message, param=param)
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> tuple[tuple[str, str], ...]:
        # Retry-After takes whole seconds; never tell a client 0.
        return (("Retry-After", str(max(1, math.ceil(self.retry_after_s)))),)


# Said by the request path ------------------------------------------------------


class InvalidRequest(RouterError):
    """The request cannot be read: fix it as the message says and send it again."""

    status = 400
    type = "invalid_request_error"


class BodyTooLarge(RouterError):
    """The request body is larger than this router accepts."""

    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class RequestTimeout(RouterError):
    """The request did not arrive in time: send it whole, without pauses."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class TooManyConnections(_RetryLater):
    """The router has as many API connections open as it may: try again as Retry-After says, or reuse a connection."""

    status = 503
    type = "server_error"
    code = "too_many_connections"


class NotFound(RouterError):
    """There is nothing at this address: the router serves /v1/chat/completions, /v1/completions, /v1/embeddings and /v1/models."""

    status = 404
    type = "invalid_request_error"
    code = "unknown_url"


class UpstreamFailed(RouterError):
    """No engine serving this model could be reached; the request was not answered, so sending it again is safe."""

    status = 502
    type = "server_error"
    code = "upstream_failed"


class GatewayTimeout(RouterError):
    """The engine serving this request did not answer in time; it may have done the work, so sending it again costs it twice."""

    status = 504
    type = "server_error"
    code = "upstream_timeout"


# Said by the dispatcher ---------------------------------------------------------


class Unauthorized(RouterError):
    """No valid API key: send one as "Authorization: Bearer KEY"."""

    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class Forbidden(RouterError):
    """This API key may not use this model."""

    status = 403
    type = "permission_error"
    code = "model_not_allowed"


class UnknownModel(RouterError):
    """No such model here: GET /v1/models lists the ones served."""

    status = 404
    type = "invalid_request_error"
    code = "model_not_found"

    def __init__(self, message: str | None = None, *, param: str | None = "model"):
        super().__init__(message, param=param)


class RateLimited(_RetryLater):
    """This API key is over its rate limit: wait as Retry-After says."""

    code = "rate_limit_exceeded"


class QueueFull(_RetryLater):
    """Every engine serving this model is busy and the queue is full: wait as Retry-After says."""

    code = "queue_full"


class QueueTimeout(_RetryLater):
    """Every engine serving this model stayed busy for as long as a request may wait in the queue."""

    code = "queue_timeout"


class NoReadyEndpoint(_RetryLater):
    """No engine serving this model is ready: try again as Retry-After says."""

    status = 503
    type = "server_error"
    code = "no_ready_endpoint"


def error_body(status_type: str, message: str, param: str | None, code: str | None) -> bytes:
    return json.dumps({"error": {"message": message, "type": status_type, "param": param, "code": code}}).encode()


def render(error: RouterError) -> bytes:
    """The JSON body for ``error``."""
    return error_body(error.type, error.message, error.param, error.code)
