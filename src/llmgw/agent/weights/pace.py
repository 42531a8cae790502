"""A fetch's pace: a minimum rate over a window, and a deadline for all of it.

The stall timeout alone never ends a trickle: a mirror that sends a byte
every 20 s is never 60 s silent, and what waits on it (the shards wanting
those weights, an engine's install, a newer plan) would wait for ever.  So
every fetch a :class:`~llmgw.agent.weights.Fetcher` given limits makes is
also held to them (agent.yaml's ``weights:`` for weights, ``installs:`` for
an engine's release archives):

* its average rate over the last ``rate_window_s`` (once bytes have come
  for that long) must be at least ``min_rate_bytes_per_s``;
* all of it must come within ``download_deadline_s`` of its first request.

Breaking either gives the fetch up through *give_up*, with a sentence naming
the URL, what was measured, and the key to change; the fetcher keeps the
``.partial``, so the next attempt resumes where this one stopped.  The rate
counts only time a response body is being read: hashing a resumed prefix
or waiting for another agent's lock is not a slow link.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator, Union

if TYPE_CHECKING:
    from llmgw.config.agent import InstallLimits, WeightsLimits

    Limits = Union[InstallLimits, WeightsLimits]


class Pace:
    """One fetch's bytes over time, held to *limits* (named in messages as *where*); ``clock=reactor`` unless testing."""

    def __init__(self, clock, what: str, limits: Limits, where: str, give_up: Callable[[str], None]):
        self.clock, self.what, self.limits, self.where = clock, what, limits, where
        self.give_up = give_up
        self.moved = 0  # bytes received by this fetch, every file of it
        self.samples: list[tuple[float, int]] = []  # (when, moved), while a body is being read
        self.idle_since: float | None = None  # when the last body ended; None while one is read
        deadline = limits.download_deadline_s
        self.timer = None if deadline is None else clock.callLater(deadline, self._late)

    def stop(self) -> None:
        if self.timer is not None and self.timer.active():
            self.timer.cancel()

    @contextmanager
    def reading(self) -> Iterator[None]:
        """While a body is read: the time between two bodies (a repository's next file asked for, its
        resumed prefix hashed) is taken out of the samples, so that only reading is measured."""
        if self.idle_since is not None:
            gap = self.clock.seconds() - self.idle_since
            self.samples = [(when + gap, moved) for when, moved in self.samples]
        self.idle_since = None
        try:
            yield
        finally:
            self.idle_since = self.clock.seconds()

    def look(self, url: str, resumes_at: str) -> bool:
        """Take a sample while *url*'s body is read; False when the fetch was given up for its rate."""
        now = self.clock.seconds()
        self.samples.append((now, self.moved))
        minimum, window = self.limits.min_rate_bytes_per_s, self.limits.rate_window_s
        if minimum is None or now - self.samples[0][0] < window:
            return True
        # The oldest sample still inside the window, and the newest before it: the rate over at least the window.
        while len(self.samples) > 1 and now - self.samples[1][0] >= window:
            del self.samples[0]
        since, then = self.samples[0]
        rate = (self.moved - then) / (now - since)
        if rate >= minimum:
            return True
        self.stop()
        self.give_up(
            f"{url}: {rate_text(rate)} over the last {now - since:g} s, under the minimum of "
            f"{rate_text(minimum)} (min_rate_bytes_per_s of {self.where}); the next attempt resumes from {resumes_at}")
        return False

    def _late(self) -> None:
        self.give_up(
            f"{self.what}: not all of it came within {self.limits.download_deadline_s:g} s "
            f"({self.moved} bytes came in this attempt); the download_deadline_s of {self.where} gives it that "
            "long, and the next attempt resumes from there")


def rate_text(bps: float) -> str:
    return f"{bps / 1e3:.1f} kB/s" if bps >= 1e3 else f"{bps:.1f} bytes/s"
