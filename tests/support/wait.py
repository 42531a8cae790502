"""Waiting for something to become true, with a deadline, saying what was awaited.

Each waiter calls *predicate* until it returns something true and returns
that.  At the deadline it fails with *what* and the last value the predicate
gave, which is usually the thing a reader of the failure needs.  Nothing here
waits for something *not* to happen: a test proves absence by waiting for a
later thing that could only come after it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from twisted.internet import task

Predicate = Callable[[], Any]


class NeverHappened(AssertionError):
    """What a test waited for did not happen in time."""


class _Deadline:
    def __init__(self, what: str, timeout: float, detail: Callable[[], str] | None):
        self.what, self.timeout, self.detail = what, timeout, detail
        self.at = time.monotonic() + timeout

    def check(self, last: Any) -> None:
        """Fail, saying what was awaited and what *last* looked like, once the deadline has passed."""
        if time.monotonic() >= self.at:
            more = f"\n{self.detail()}" if self.detail is not None else ""
            raise NeverHappened(f"timed out after {self.timeout:g} s waiting for {self.what} (last: {last!r}){more}")


def wait_for(predicate: Predicate, timeout: float, what: str, interval: float = 0.05,
             detail: Callable[[], str] | None = None):
    """Block until *predicate()* is true: for tests that drive processes from this thread.

    *detail*, if given, is called at the deadline for more to print (logs, a screen).
    """
    deadline = _Deadline(what, timeout, detail)
    while not (last := predicate()):
        deadline.check(last)
        time.sleep(interval)
    return last


async def _until(predicate: Predicate, what: str, timeout: float, interval: float,
                 pause: Callable[[float], Awaitable[Any]], detail: Callable[[], str] | None):
    deadline = _Deadline(what, timeout, detail)
    while not (last := predicate()):
        deadline.check(last)
        await pause(interval)
    return last


def sleep(seconds: float, clock=None):
    """A Deferred that fires after *seconds* of the reactor (or *clock*).

    For pacing, such as letting bytes move between advances of a fake clock;
    never as the wait before an assertion.
    """
    if clock is None:
        from twisted.internet import reactor as clock
    return task.deferLater(clock, seconds, lambda: None)


async def until(predicate: Predicate, what: str, timeout: float = 15.0, interval: float = 0.01,
                detail: Callable[[], str] | None = None, pause: Callable[[float], Awaitable[Any]] = sleep):
    """Wait, with Twisted's reactor running, for *predicate()* to be true (pytest-twisted tests).

    *pause* may do more than wait between two looks: advance a test's fake clock, say.
    """
    return await _until(predicate, what, timeout, interval, pause, detail)


async def until_awaited(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 15.0,
                        interval: float = 0.05, detail: Callable[[], str] | None = None):
    """As ``until``, for a *check* that must itself wait to look: a page to load, a request to be answered."""
    deadline = _Deadline(what, timeout, detail)
    while not (last := await check()):
        deadline.check(last)
        await sleep(interval)
    return last


async def until_async(predicate: Predicate, what: str, timeout: float = 15.0, interval: float = 0.05,
                      detail: Callable[[], str] | None = None,
                      pause: Callable[[float], Awaitable[Any]] = asyncio.sleep):
    """Wait on the running asyncio loop for *predicate()* to be true; *pause* may pump an app instead."""
    return await _until(predicate, what, timeout, interval, pause, detail)
