"""Admission: how many requests an endpoint takes at once, and the queue for the rest.

Each endpoint takes at most ``router.admission.max_inflight_per_endpoint``
requests at a time.  When every endpoint of a model is at its limit, a request
waits in that model's queue, oldest first, for at most ``queue_timeout_s``;
the queue holds ``queue`` requests and refuses the next with ``QueueFull``.
Both refusals are 429 with a ``Retry-After`` in whole seconds: how long the
queue ahead would take to drain at the pace requests have been finishing.

A freed slot goes to exactly one waiter, the oldest that can use it, so a
release never wakes the whole queue.  A retry (a request that already held a
slot and failed before its first byte) waits ahead of every new request, and
only for an endpoint it has not tried.  A waiter whose client went away is
cancelled (``Deferred.cancel``) and leaves the queue at once.

This module keeps the queues; ``dispatch.Dispatcher`` decides when a slot is
free and which endpoint it is (scoring), and calls ``serve`` whenever one may
have freed: a release, a new endpoint table, an endpoint back from cool-down.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Generic, Iterable, Sequence, TypeVar

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from llmgw.config.routing import Admission
from llmgw.router import errors
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
    """A request waiting for a slot: what to admit it with, and the Deferred its caller holds."""

    __slots__ = ("item", "exclude", "deferred", "timer", "retry")

    def __init__(self, item: T, exclude: frozenset[str], retry: bool):
        self.item = item
        self.exclude = exclude
        self.retry = retry
        self.deferred: defer.Deferred = None  # type: ignore[assignment]
        self.timer: IDelayedCall | None = None


class ModelQueue(Generic[T]):
    """One model's waiters: retries first, then new requests, each oldest first.

    Insertion-ordered dicts used as ordered sets: the head is ``next(iter())``
    and a cancelled waiter leaves from the middle in constant time.
    """

    def __init__(self, clock: IReactorTime, model: str, limits: Admission):
        self.clock = clock
        self.model = model
        self.limits = limits
        self._retries: dict[Waiter[T], None] = {}
        self._waiters: dict[Waiter[T], None] = {}
        # Running mean of how long a request held its slot, for Retry-After.
        self.service_s: float | None = None
        # Set by the dispatcher: how many slots the model has (healthy endpoints × limit),
        # and what to call when the number waiting changes (metrics).
        self.slots: Callable[[], int] = lambda: 0
        self.changed: Callable[[int], None] | None = None

    def __len__(self) -> int:
        return len(self._retries) + len(self._waiters)

    @property
    def depth(self) -> int:
        """New requests waiting (retries are not counted against ``queue``)."""
        return len(self._waiters)

    def waiting(self) -> list[T]:
        """Every waiter's item, in the order they will be served."""
        return [w.item for w in self._retries] + [w.item for w in self._waiters]

    def observe(self, held_s: float) -> None:
        """A request released its slot after *held_s* seconds."""
        if self.service_s is None:
            self.service_s = held_s
        else:
            self.service_s += SERVICE_EWMA_WEIGHT * (held_s - self.service_s)

    def retry_after(self, ahead: int | None = None) -> int:
        return retry_after_s(
            len(self) if ahead is None else ahead, self.slots(), self.service_s, self.limits.queue_timeout_s
        )

    def wait(self, item: T, exclude: frozenset[str] = frozenset(), retry: bool = False) -> defer.Deferred:
        """A Deferred that fires with what ``serve`` gives *item*; ``QueueFull`` if there is no room.

        It fails with ``QueueTimeout`` after ``queue_timeout_s``; cancelling it
        takes the waiter out of the queue.
        """
        if not retry and len(self._waiters) >= self.limits.queue:
            after = self.retry_after()
            raise errors.QueueFull(
                f"model {self.model!r} is at capacity and its queue is full "
                f"({self.limits.queue} waiting); retry in {after} s",
                retry_after_s=after,
            )
        waiter: Waiter[T] = Waiter(item, exclude, retry)
        queue = self._retries if retry else self._waiters
        queue[waiter] = None
        if self.changed is not None:
            self.changed(len(self))

        def cancel(d: defer.Deferred) -> None:
            self._remove(waiter)

        waiter.deferred = defer.Deferred(cancel)
        waiter.timer = self.clock.callLater(self.limits.queue_timeout_s, self._expire, waiter)
        return waiter.deferred

    def _remove(self, waiter: Waiter[T]) -> None:
        (self._retries if waiter.retry else self._waiters).pop(waiter, None)
        if waiter.timer is not None and waiter.timer.active():
            waiter.timer.cancel()
        waiter.timer = None
        if self.changed is not None:
            self.changed(len(self))

    def _expire(self, waiter: Waiter[T]) -> None:
        waiter.timer = None
        ahead = len(self)
        self._remove(waiter)
        after = self.retry_after(ahead)
        waiter.deferred.errback(
            errors.QueueTimeout(
                f"model {self.model!r} had no free slot for {self.limits.queue_timeout_s:g} s "
                f"({ahead} waiting); retry in {after} s",
                retry_after_s=after,
            )
        )

    def serve(self, has_room: Callable[[], bool], admit: Callable[[T, frozenset[str]], object | None]) -> int:
        """Hand free slots to waiters in order while *has_room*; returns how many were served.

        *admit(item, exclude)* returns what the waiter's Deferred fires with, or
        ``None`` when no free slot suits this waiter (all it may use are taken
        or excluded); the next waiter is offered the slot instead.
        """
        served = 0
        while (self._retries or self._waiters) and has_room():
            for waiter in itertools.chain(self._retries, self._waiters):
                result = admit(waiter.item, waiter.exclude)
                if result is not None:
                    # Out of the loop before anything changes the queues: the
                    # waiter's callbacks may release, admit or cancel at once.
                    self._remove(waiter)
                    served += 1
                    waiter.deferred.callback(result)
                    break
            else:
                break
        return served

    def _in_order(self) -> list[Waiter[T]]:
        return list(self._retries) + list(self._waiters)

    def fail_all(self, make_error: Callable[[], Exception]) -> None:
        """Fail every waiter (the model's endpoints are all gone)."""
        for waiter in self._in_order():
            self._remove(waiter)
            waiter.deferred.errback(make_error())


def capacity(endpoints: Sequence[Endpoint], limit: int) -> int:
    """The model's slots: *limit* for each healthy endpoint."""
    return limit * sum(1 for e in endpoints if e.healthy)
