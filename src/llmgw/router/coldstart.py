"""Requests held while a model starts on demand: a cold start is waited for, not refused.

A model the endpoint table names in ``elastic`` (``replicas: {min: 0, ...}``)
may have no endpoint at all: it sleeps until a request comes.  Such a request
is *held* here rather than answered 503, while the control plane (told at once
by the router's urgent load report) places and starts a replica:

- at most ``ColdStart.max_held`` per model in this router; the next is 503 at
  once, saying how many are held;
- for at most ``ColdStart.timeout_s``; then 503 with ``Retry-After`` and the
  control plane's words for the model ("starting on demand: node03: fetching
  qwen.gguf 41% (12/29 GB)"), prefixed with how long it was held;
- when the table brings endpoints for the model, ``release`` hands the held
  requests to the dispatcher in arrival order, before any request that comes
  after them; a table that no longer names the model elastic fails them with
  the 503 at once (``fail``);
- a request whose client goes away (``Deferred.cancel``) leaves at once.

The dispatcher decides *whether* a request is held (elastic, and no endpoint
in the table); this module keeps the held requests and their timers.  Pure
and clock-driven, like admission.
"""

from __future__ import annotations

from typing import Callable, Generic, Mapping, TypeVar

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from llmgw.router import errors
from llmgw.views import ColdStart

T = TypeVar("T")

#: Retry-After of a held request's 503: a retry is held again while the model still starts.
RETRY_AFTER_S = 1.0


class Held(Generic[T]):
    """One held request: what to admit it with, the Deferred its caller holds, and since when."""

    __slots__ = ("item", "deferred", "timer", "since", "forward")

    def __init__(self, item: T, since: float):
        self.item = item
        self.since = since
        self.deferred: defer.Deferred = None  # type: ignore[assignment]
        self.timer: IDelayedCall | None = None
        # Once released into admission: what cancelling the caller's Deferred cancels there.
        self.forward: Callable[[], None] | None = None


class ColdStarts(Generic[T]):
    """Every elastic model's held requests in this router, each model's in arrival order."""

    def __init__(self, clock: IReactorTime, metrics=None):
        self.clock = clock
        # The table's elastic models and how each is held (``EndpointTable.elastic``).
        self.policies: dict[str, ColdStart] = {}
        # Why a model has no endpoint, in the control plane's words (the dispatcher's ``unavailable``).
        self.why: Callable[[str], str] = lambda model: "no replica is running"
        # Called when a model goes from none held to one: the router's urgent load report.
        self.first_held: Callable[[str], None] | None = None
        # ``elasticmetrics.ElasticMetrics`` or None.
        self.metrics = metrics
        self._held: dict[str, dict[Held[T], None]] = {}

    def count(self, model: str) -> int:
        """Requests held for *model* now."""
        held = self._held.get(model)
        return 0 if held is None else len(held)

    def models(self) -> list[str]:
        """The models with a request held, sorted."""
        return sorted(self._held)

    def hold(self, model: str, item: T) -> defer.Deferred:
        """A Deferred that fires once ``release`` admits *item*; raises ``NoReadyEndpoint`` when *model* is full.

        It fails with ``NoReadyEndpoint`` after the model's ``timeout_s``;
        cancelling it takes the request out at once.
        """
        policy = self.policies[model]
        held = self._held.get(model)
        n = 0 if held is None else len(held)
        if n >= policy.max_held:
            raise errors.NoReadyEndpoint(
                f"model {model!r} has no ready replica: it is starting on demand and this router holds "
                f"{n} requests for it already, as many as it may (scale.max_held: {policy.max_held}); "
                f"retry in {RETRY_AFTER_S:g} s: {self.why(model)}",
                retry_after_s=RETRY_AFTER_S,
            )
        if held is None:
            held = self._held[model] = {}
        entry: Held[T] = Held(item, self.clock.seconds())
        held[entry] = None

        def cancel(d: defer.Deferred) -> None:
            if entry.forward is not None:
                entry.forward()
            else:
                self._leave(model, entry)

        entry.deferred = defer.Deferred(cancel)
        entry.timer = self.clock.callLater(policy.timeout_s, self._expire, model, entry, policy.timeout_s)
        self._changed(model)
        if n == 0 and self.first_held is not None:
            self.first_held(model)
        return entry.deferred

    def release(self, model: str, grant: Callable[[T], object | None],
                enqueue: Callable[[T], defer.Deferred]) -> int:
        """Hand *model*'s held requests on, oldest first; returns how many.

        *grant(item)* is a lease now, or ``None`` when no slot is free; from
        the first ``None`` on, every later request goes to *enqueue(item)*
        (admission's queue, ahead of new requests) in the same order.
        """
        taken = self._take(model)
        queued = False
        for entry in taken:
            lease = None if queued else grant(entry.item)
            if lease is not None:
                entry.deferred.callback(lease)
                continue
            queued = True
            waiting = enqueue(entry.item)
            entry.forward = waiting.cancel
            waiting.chainDeferred(entry.deferred)
        return len(taken)

    def fail(self, model: str, make_error: Callable[[], Exception]) -> None:
        """Fail every request held for *model* (the table no longer names it elastic)."""
        for entry in self._take(model):
            entry.deferred.errback(make_error())

    def set_policies(self, policies: Mapping[str, ColdStart]) -> None:
        """The table's ``elastic``: a changed bound counts for requests held from now on."""
        self.policies = dict(policies)

    def _take(self, model: str) -> list[Held[T]]:
        held = self._held.pop(model, None)
        if not held:
            return []
        now = self.clock.seconds()
        for entry in held:
            self._untime(entry)
            self._observe(model, now - entry.since)
        self._changed(model)
        return list(held)

    def _leave(self, model: str, entry: Held[T]) -> None:
        held = self._held.get(model)
        if held is None or held.pop(entry, False) is False:
            return
        if not held:
            del self._held[model]
        self._untime(entry)
        self._observe(model, self.clock.seconds() - entry.since)
        self._changed(model)

    def _expire(self, model: str, entry: Held[T], timeout_s: float) -> None:
        entry.timer = None
        self._leave(model, entry)
        if self.metrics is not None:
            self.metrics.cold_start_timeout(model)
        entry.deferred.errback(errors.NoReadyEndpoint(
            f"model {model!r} has no ready replica: held {timeout_s:g} s while the model starts on demand "
            f"(scale.cold_start_timeout_s): {self.why(model)}",
            retry_after_s=RETRY_AFTER_S,
        ))

    @staticmethod
    def _untime(entry: Held[T]) -> None:
        if entry.timer is not None and entry.timer.active():
            entry.timer.cancel()
        entry.timer = None

    def _observe(self, model: str, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.held_for(model, seconds)

    def _changed(self, model: str) -> None:
        if self.metrics is not None:
            self.metrics.held(model, self.count(model))
