"""Admission: how many requests an endpoint takes at once, and the queue for the rest.

Each endpoint takes at most ``router.admission.max_inflight_per_endpoint``
requests at a time.  When every endpoint of a model is at its limit, a request
waits in that model's queue for at most ``queue_timeout_s``;
the queue holds ``queue`` requests and refuses the next with ``QueueFull``.
Both refusals are 429 with a ``Retry-After`` in whole seconds: how long the
queue ahead would take to drain at the pace requests have been finishing.

A freed slot goes to exactly one waiter, so a release never wakes the whole
queue.  A retry (a request that already held a slot and failed before its
first byte) waits ahead of every new request, and only for an endpoint it has
not tried.  New requests are served fairly between the clients (API keys, or
client addresses) that wait, by priority band, cap and the slots each holds:
``fairqueue.py``.  A waiter whose client went away is
cancelled (``Deferred.cancel``) and leaves the queue at once.

This module keeps the queues; ``dispatch.Dispatcher`` decides when a slot is
free and which endpoint it is (scoring), and calls ``serve`` whenever one may
have freed: a release, a new endpoint table, an endpoint back from cool-down.
"""

from __future__ import annotations

import math
from typing import Callable, Generic, Iterable, Sequence, TypeVar

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from llmgw.config.routing import Admission
from llmgw.router import errors
from llmgw.router.fairqueue import FairQueue, Flow
from llmgw.router.scoring import Endpoint

T = TypeVar("T")

# Until a model has finished a request, assume a request holds its slot this long.
DEFAULT_SERVICE_S = 1.0
# Weight of the newest observation in the running mean of how long a slot is held.
SERVICE_EWMA_WEIGHT = 0.2


def free(endpoints: Iterable[Endpoint], limit: int, exclude: frozenset[str] = frozenset()) -> list[Endpoint]:
    """The endpoints that may take one more request now: healthy, under *limit*, not in *exclude*."""
    return [e for e in endpoints if e.healthy and e.inflight < limit and e.id not in exclude]


def retry_after_s(ahead: int, slots: int, service_s: float | None, ceiling_s: float) -> int:
    """Whole seconds until *ahead* queued requests have gone through *slots* slots; 1 to *ceiling_s*.

    *service_s* is how long a request holds its slot (``None``: not known yet,
    assume ``DEFAULT_SERVICE_S``).  With no slot at all (every endpoint
    failing) the answer is the ceiling.
    """
    top = max(1, math.ceil(ceiling_s))
    if slots <= 0:
        return top
    seconds = max(ahead, 1) * (DEFAULT_SERVICE_S if service_s is None else service_s) / slots
    return min(top, max(1, math.ceil(seconds - 1e-9)))


class Waiter(Generic[T]):
    """A request waiting for a slot: what to admit it with, its flow, and the Deferred its caller holds."""

    __slots__ = ("item", "exclude", "deferred", "timer", "retry", "flow")

    def __init__(self, item: T, exclude: frozenset[str], retry: bool, flow: Flow):
        self.item = item
        self.exclude = exclude
        self.retry = retry
        self.flow = flow
        self.deferred: defer.Deferred = None  # type: ignore[assignment]
        self.timer: IDelayedCall | None = None


class ModelQueue(Generic[T]):
    """One model's waiters: retries first, oldest first; then new requests, fairly between flows (``fairqueue``).

    ``fair.flows`` also counts the slots each flow holds: the dispatcher adds
    one when it grants a lease and takes it off when the lease is released.
    """

    def __init__(self, clock: IReactorTime, model: str, limits: Admission):
        self.clock = clock
        self.model = model
        self.limits = limits
        self._retries: dict[Waiter[T], None] = {}
        self.fair: FairQueue[Waiter[T]] = FairQueue()
        # Running mean of how long a request held its slot, for Retry-After.
        self.service_s: float | None = None
        # Set by the dispatcher: how many slots the model has (healthy endpoints × limit),
        # and what to call when the number waiting changes (metrics).
        self.slots: Callable[[], int] = lambda: 0
        self.changed: Callable[[int], None] | None = None

    def __len__(self) -> int:
        return len(self._retries) + self.fair.depth

    @property
    def depth(self) -> int:
        """New requests waiting (retries are not counted against ``queue``)."""
        return self.fair.depth

    def waiting(self) -> list[T]:
        """Every waiter's item: retries in the order they will be served, then each flow's, highest band first."""
        return [w.item for w in self._retries] + [w.item for f in self.fair.waiting_flows() for w in f.waiters]

    def observe(self, held_s: float) -> None:
        """A request released its slot after *held_s* seconds."""
        if self.service_s is None:
            self.service_s = held_s
        else:
            self.service_s += SERVICE_EWMA_WEIGHT * (held_s - self.service_s)

    def retry_after(self, ahead: int | None = None, flow: Flow | None = None) -> int:
        """Whole seconds until a new waiter (of *flow*, if given: its share and cap) would likely have a slot."""
        slots = self.slots()
        if ahead is None:
            ahead = len(self) if flow is None else len(self._retries) + self.fair.ahead_of(flow)
        seconds = retry_after_s(ahead, slots, self.service_s, self.limits.queue_timeout_s)
        if flow is not None and flow.cap is not None:
            # Its own waiters go through its cap's slots, however many the model has.
            seconds = max(seconds, retry_after_s(len(flow.waiters) + 1, flow.cap, self.service_s,
                                                 self.limits.queue_timeout_s))
        return seconds

    def wait(self, item: T, flow: Flow, exclude: frozenset[str] = frozenset(), retry: bool = False) -> defer.Deferred:
        """A Deferred that fires with what ``serve`` gives *item*; ``QueueFull`` if there is no room.

        A full queue makes room by dropping the newest waiter of the flow with
        the most (``QueueFull`` for it) when that flow has at least two more
        than *flow*: one client filling the queue cannot lock the others out.
        It fails with ``QueueTimeout`` after ``queue_timeout_s``; cancelling it
        takes the waiter out of the queue.
        """
        fair = self.fair
        if not retry and fair.depth >= self.limits.queue:
            fullest = fair.fullest()
            if fullest is None or len(fullest.waiters) < len(flow.waiters) + 2:
                after = self.retry_after(flow=flow)
                fair.forget(flow)
                raise errors.QueueFull(
                    f"model {self.model!r} is at capacity and its queue is full "
                    f"({self.limits.queue} waiting, {len(flow.waiters)} of them yours); retry in {after} s",
                    retry_after_s=after,
                )
            self._push_out(fullest)
        waiter: Waiter[T] = Waiter(item, exclude, retry, flow)
        if retry:
            self._retries[waiter] = None
        else:
            fair.push(flow, waiter)
        if self.changed is not None:
            self.changed(len(self))

        def cancel(d: defer.Deferred) -> None:
            self._remove(waiter)

        waiter.deferred = defer.Deferred(cancel)
        waiter.timer = self.clock.callLater(self.limits.queue_timeout_s, self._expire, waiter)
        return waiter.deferred

    def _push_out(self, flow: Flow) -> None:
        waiter = next(reversed(flow.waiters))
        self._remove(waiter)
        after = self.retry_after(flow=flow)
        waiter.deferred.errback(errors.QueueFull(
            f"model {self.model!r} is at capacity and its queue is full ({self.limits.queue} waiting); "
            f"this request, the newest of the {len(flow.waiters) + 1} waiting from one client, gave its place "
            f"to another client's; retry in {after} s",
            retry_after_s=after,
        ))

    def _remove(self, waiter: Waiter[T]) -> None:
        if waiter.retry:
            self._retries.pop(waiter, None)
            self.fair.forget(waiter.flow)
        else:
            self.fair.remove(waiter.flow, waiter)
        if waiter.timer is not None and waiter.timer.active():
            waiter.timer.cancel()
        waiter.timer = None
        if self.changed is not None:
            self.changed(len(self))

    def _expire(self, waiter: Waiter[T]) -> None:
        waiter.timer = None
        ahead = len(self)
        self._remove(waiter)
        after = self.retry_after(flow=waiter.flow)
        waiter.deferred.errback(
            errors.QueueTimeout(
                f"model {self.model!r} had no free slot for {self.limits.queue_timeout_s:g} s "
                f"({ahead} waiting); retry in {after} s",
                retry_after_s=after,
            )
        )

    def serve(self, has_room: Callable[[], bool], admit: Callable[[T, frozenset[str]], object | None]) -> int:
        """Hand free slots to waiters while *has_room*: retries first, then the flow ``fairqueue`` picks.

        *admit(item, exclude)* returns what the waiter's Deferred fires with, or
        ``None`` when no free slot suits this waiter (all it may use are taken
        or excluded); the next retry is offered the slot instead.  Returns how
        many were served.
        """
        served = 0
        fair = self.fair
        while (self._retries or fair.depth) and has_room():
            for waiter in self._retries:
                result = admit(waiter.item, waiter.exclude)
                if result is not None:
                    break
            else:
                flow = fair.pick()
                if flow is None:
                    break
                waiter = next(iter(flow.waiters))
                result = admit(waiter.item, waiter.exclude)
                if result is None:
                    break
            # Out of the loop before anything changes the queues: the
            # waiter's callbacks may release, admit or cancel at once.
            self._remove(waiter)
            served += 1
            waiter.deferred.callback(result)
        return served

    def _in_order(self) -> list[Waiter[T]]:
        return list(self._retries) + [w for f in self.fair.waiting_flows() for w in f.waiters]

    def fail_all(self, make_error: Callable[[], Exception]) -> None:
        """Fail every waiter (the model's endpoints are all gone)."""
        for waiter in self._in_order():
            self._remove(waiter)
            waiter.deferred.errback(make_error())


def capacity(endpoints: Sequence[Endpoint], limit: int) -> int:
    """The model's slots: *limit* for each healthy endpoint."""
    return limit * sum(1 for e in endpoints if e.healthy)
