"""A request's slot on one engine (``Lease``), and the request across its tries (``Attempt``).

``dispatch.Dispatcher`` makes both; the HTTP path holds the lease and calls
``release`` exactly once it is done (more calls are ignored), ``usage`` when
the engine reported tokens, and ``retry`` when the request failed before its
first byte reached the client (``contract.EngineLease``).  A lease also holds
the share it counts against (``fairqueue.Flow``) until it is released.
"""

from __future__ import annotations

import ipaddress

from typing import TYPE_CHECKING

from twisted.internet import defer

from llmgw.config.routing import APIKey
from llmgw.router.fairqueue import Flow
from llmgw.router.scoring import Endpoint

if TYPE_CHECKING:
    from llmgw.router.dispatch import Dispatcher, RequestInfo

OUTCOMES = ("ok", "error", "client_gone", "upstream_failed")


def share_of(address: str) -> str:
    """Whose share an address is on: itself, or for IPv6 its /64 (one host is given a /64, not one address)."""
    if ":" not in address:
        return address
    try:
        ip = ipaddress.IPv6Address(address.partition("%")[0])
    except ValueError:
        return address
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))


class Attempt:
    """One client request across its tries: which endpoints it has used already."""

    __slots__ = ("model", "request", "key", "tried", "queued_at", "flow")

    def __init__(self, model: str, request: RequestInfo, key: APIKey | None):
        self.model = model
        self.request = request
        self.key = key
        # Whose share it is on (``fairqueue``): the key's name, or the client's address.
        self.flow = "key " + key.name if key is not None else "address " + share_of(request.client)
        self.tried: set[str] = set()
        # When it started waiting for a slot; None while it is not waiting.
        self.queued_at: float | None = None


class Lease:
    """A slot on ``endpoint`` held for one request; ``release`` gives it back."""

    __slots__ = ("endpoint", "started_at", "queued_s", "released", "flow", "_dispatcher", "_attempt")

    def __init__(self, dispatcher: Dispatcher, attempt: Attempt, endpoint: Endpoint, now: float, queued_s: float,
                 flow: Flow):
        self.endpoint = endpoint
        # The share (``fairqueue.Flow``) this slot counts against until it is released.
        self.flow = flow
        self.started_at = now
        # How long the request waited in the queue for this slot (0.0: not at all).
        self.queued_s = queued_s
        self.released = False
        self._dispatcher = dispatcher
        self._attempt = attempt

    @property
    def model(self) -> str:
        return self._attempt.model

    @property
    def key(self) -> APIKey | None:
        """The API key the request came with; ``None`` on an open API."""
        return self._attempt.key

    @property
    def attempt(self) -> int:
        """1 for the first endpoint this request was sent to, 2 for its first retry, and so on."""
        return len(self._attempt.tried)

    def release(self, outcome: str = "ok") -> None:
        """Give the slot back: ``ok``, ``error`` (the engine answered with an error),
        ``client_gone`` or ``upstream_failed`` (no answer: refused, reset, timed out)."""
        if self.released:
            return
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, not {outcome!r}")
        self.released = True
        self._dispatcher._released(self, outcome)

    def usage(self, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        """Charge the tokens the engine reported to the key's tokens per minute (unknown counts are not charged)."""
        dispatcher, key = self._dispatcher, self._attempt.key
        dispatcher._keys.charge_tokens(key, (prompt_tokens or 0) + (completion_tokens or 0))
        count = dispatcher._key_tokens
        if key is not None and count is not None:
            for kind, n in (("prompt", prompt_tokens), ("completion", completion_tokens)):
                if n is not None:
                    count(key.name, kind, n)

    def retry(self) -> defer.Deferred[Lease] | None:
        """A lease on an endpoint this request has not tried yet, or ``None`` if there is none.

        Releases this lease as ``upstream_failed`` first, unless it was released
        already.  The Deferred may wait for a slot (ahead of new requests) and
        fails with ``QueueTimeout`` like any waiter.
        """
        self.release("upstream_failed")
        return self._dispatcher._retry(self._attempt)
