"""What the router's HTTP path asks of the rest of the router: a dispatcher, its leases, and metrics.

``llmgw.router.proxy`` is typed against these protocols only: ``Admitter.admit``
→ ``EngineLease``, ``EngineLease.usage``/``release``/``retry`` and the
``Metrics`` hooks.  ``dispatch.Dispatcher`` and its ``Lease`` meet them (and
the tests' stand-in dispatcher does too); ``tests/router/test_contract.py``
holds the dispatcher's side to them, method by method.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from twisted.internet import defer

    from llmgw.router.dispatch import RequestInfo


class EngineAddress(Protocol):
    """What the HTTP path needs of an endpoint: which one it is and where to connect."""

    id: str
    host: str
    port: int


class EngineLease(Protocol):
    """What the HTTP path needs of a lease: a place for one request on one engine, held until ``release``."""

    endpoint: EngineAddress

    def usage(self, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        """The tokens the engine said the request took (None: it did not say); called before ``release``."""

    def release(self, outcome: str) -> None:
        """The request is done with this engine, once per lease.

        ``ok``: the engine's answer, whatever its status below 500, reached the client.
        ``error``: the engine answered 5xx and that reached the client.
        ``client_gone``: the client left before the answer was complete.
        ``upstream_failed``: the engine could not be reached, broke off its answer, or
        answered 502/503 before any byte reached the client.
        """

    def retry(self) -> defer.Deferred[EngineLease] | None:
        """After ``release("upstream_failed")`` and before any byte reached the client: a lease on another engine, or None."""


class Admitter(Protocol):
    """What the HTTP path needs of a dispatcher: ``dispatch.Dispatcher``, or a test's stand-in."""

    def admit(self, model: str, request: RequestInfo) -> defer.Deferred[EngineLease]:
        """A lease once the request may go to an engine; fails with a ``llmgw.router.errors`` error when it may not."""

    def models(self) -> list[str]:
        """The ids of the models a client may ask for now (GET /v1/models)."""


class Metrics(Protocol):
    def request_done(self, model: str, path: str, status: int, seconds: float, ttft_seconds: float | None,
                     prompt_tokens: int | None, completion_tokens: int | None) -> None:
        """A response went to the client in full (the router's own errors included); ``ttft_seconds`` for streams."""

    def client_gone(self, model: str) -> None:
        """A client left before its response was complete."""

    def request_started(self, model: str) -> None:
        """A request to relay arrived (it may queue); ``request_finished`` follows exactly once."""

    def request_finished(self, model: str) -> None:
        """A request counted by ``request_started`` is over for its client."""

    def bytes_relayed(self, model: str, direction: str, n: int) -> None:
        """Body bytes relayed for one request: ``request`` (to engines) or ``response`` (to the client)."""

    def request_body(self, path: str, n: int) -> None:
        """A request body of *n* bytes was read."""

    def admission_rejected(self, model: str, reason: str) -> None:
        """A request was refused before any engine saw it (``metrics.REJECTIONS`` names the reasons)."""

    def upstream_error(self, model: str, endpoint_id: str, kind: str) -> None:
        """An engine failed a request; ``kind``: refused, timeout, failed (connecting), reset, malformed, unavailable (502/503)."""

    def retried(self, model: str) -> None:
        """A request went to another engine after one failed it."""

    def client_timeout(self, kind: str) -> None:
        """A client connection was ended by a limit; ``kind``: idle, head, body, write_stall."""

    def client_connections(self, n: int) -> None:
        """API connections open now."""

    def connection_refused(self) -> None:
        """An API connection was refused: ``router.clients.max_connections`` were open."""
