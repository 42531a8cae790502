"""When the server collects its cyclic garbage in full: on a schedule, not whenever a quarter of its heap is new.

CPython collects the oldest generation when the objects promoted into it
since the last full collection reach a quarter of those already there.  A
server holding 10,000 nodes promotes a dozen objects per heartbeat (each
heartbeat's node record replaces the last), so it collected its whole heap
— about 1.5 million objects, a third of a second at 5,000 nodes and twice
that at 10,000 — every quarter of a minute, and every heartbeat that
arrived meanwhile waited: the heartbeat round trip's p99 at 10,000 nodes
was 0.9 s while its p50 was 1 ms.

``FullCollections`` leaves the young generations to CPython (they are
cheap and catch nearly all garbage) and takes the full collection over:
every ``FULL_EVERY_S``, or sooner once ``FULL_AFTER_LEFT`` sessions have
closed (a session's objects are the cycles worth reclaiming: a fleet that
reconnects leaves thousands).  What it starts with — modules, code,
configuration — is frozen out of every collection (``gc.freeze``).

What survives a collection is frozen too, so the next one reads only what
arrived since: at 10,000 nodes nearly all of the heap is the sessions and
records that stay, and a collection of all of it took 1.3 s (every heartbeat
arriving meanwhile waited), where one of what moved since takes about a
tenth of that.  A frozen object that becomes garbage is freed at once by its
reference count; only one caught in a cycle waits for a *deep* collection,
which thaws everything and reads it all: when ``FULL_AFTER_LEFT`` sessions
have closed (a closed session is the cycle), and at least every
``DEEP_EVERY_S``.
"""

from __future__ import annotations

import gc
import time
from typing import Callable

from twisted.application import service
from twisted.internet import task
from twisted.logger import Logger

log = Logger()

FULL_EVERY_S = 300.0
FULL_AFTER_LEFT = 1000
DEEP_EVERY_S = 3600.0
#: A gen2 threshold no count of gen1 collections reaches: CPython never starts a full collection itself.
_NEVER = 2**30


class FullCollections(service.Service):
    """Full garbage collections of what is not frozen every *every_s*; deep ones once *after_left* sessions
    closed or every *deep_every_s*; CPython's young ones as before."""

    def __init__(self, clock, sessions_left: Callable[[], int], every_s: float = FULL_EVERY_S,
                 after_left: int = FULL_AFTER_LEFT, collect: Callable[[], int] = gc.collect,
                 deep_every_s: float = DEEP_EVERY_S):
        self._clock = clock
        self._sessions_left = sessions_left
        self.every_s = every_s
        self.after_left = after_left
        self.deep_every_s = deep_every_s
        self._collect = collect
        self._saved: tuple[int, int, int] | None = None
        self._loop: task.LoopingCall | None = None
        self._last = 0.0
        self._last_deep = 0.0
        self._left_at_last = 0

    def startService(self) -> None:
        super().startService()
        self._saved = gc.get_threshold()
        young, middle, _ = self._saved
        gc.freeze()
        gc.set_threshold(young, middle, _NEVER)
        self._last = self._last_deep = self._clock.seconds()
        self._left_at_last = self._sessions_left()
        self._loop = task.LoopingCall(self._check)
        self._loop.clock = self._clock
        self._loop.start(1.0, now=False)

    def stopService(self):
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        if self._saved is not None:
            gc.set_threshold(*self._saved)
            gc.unfreeze()
            self._saved = None
        return super().stopService()

    def _check(self) -> None:
        now = self._clock.seconds()
        left = self._sessions_left()
        deep = left - self._left_at_last >= self.after_left or now - self._last_deep >= self.deep_every_s
        if not deep and now - self._last < self.every_s:
            return
        started = time.perf_counter()
        if deep:
            gc.unfreeze()  # everything is read again: the cycles frozen objects have become are found
        found = self._collect()
        gc.freeze()  # what survived is read again only by the next deep collection
        self._last = self._clock.seconds()
        if deep:
            self._last_deep, self._left_at_last = self._last, left
        log.debug("a {kind} garbage collection: {n} unreachable objects in {ms:.0f} ms; {frozen} objects frozen",
                  kind="deep" if deep else "full", n=found, ms=(time.perf_counter() - started) * 1000,
                  frozen=gc.get_freeze_count())
