"""How many lines one node may make the server log about it: a budget per window, then one summary.

A node chooses what it sends, so a line per refused report — per shard id
it invents — would let it fill the server's disk.  Each node has a budget
of lines per window; past it, refusals are counted, not written, and when
the window ends one line says how many were left out ("312 more refused
claims from node05 were not logged in the last 60 s").  Counting goes on
regardless (the metrics), so nothing is hidden from a graph.

The clock is injected: pass the reactor unless testing.
"""

from __future__ import annotations

import attrs
from twisted.logger import Logger

log = Logger()

#: Lines one node may cause in a window, and the window's length: the defaults.
LINES = 20
WINDOW_S = 60.0


@attrs.define
class _Window:
    started: float
    logged: int = 0
    left_out: int = 0
    summary: object = None  # the delayed call that writes the summary line


class LogBudget:
    """Per node, whether another line may be written now; the rest are counted and summed up once a window."""

    def __init__(self, clock, what: str, lines: int = LINES, window_s: float = WINDOW_S):
        if lines < 1 or not window_s > 0:
            raise ValueError(f"a log budget is at least 1 line in a window longer than 0 s, not {lines} in {window_s}")
        self._clock, self._what, self.lines, self.window_s = clock, what, lines, window_s
        self._windows: dict[str, _Window] = {}

    def allow(self, node_id: str) -> bool:
        """True when a line about *node_id* may be written now; False counts it toward the window's summary."""
        now = self._clock.seconds()
        window = self._windows.get(node_id)
        if window is None or now - window.started >= self.window_s:
            if window is not None and window.summary is not None:
                window.summary.cancel()
                self._summarize(node_id, window)
            window = self._windows[node_id] = _Window(now)
        if window.logged < self.lines:
            window.logged += 1
            return True
        window.left_out += 1
        if window.summary is None:
            window.summary = self._clock.callLater(window.started + self.window_s - now, self._end, node_id, window)
        return False

    def left_out(self, node_id: str) -> int:
        """Lines about *node_id* left out so far in its window, not yet summed up."""
        window = self._windows.get(node_id)
        return 0 if window is None else window.left_out

    def _end(self, node_id: str, window: _Window) -> None:
        self._summarize(node_id, window)
        if self._windows.get(node_id) is window:
            del self._windows[node_id]

    def _summarize(self, node_id: str, window: _Window) -> None:
        log.warn("{n} more {what} from {node} were not logged in the last {window:g} s (each is counted in the "
                 "metrics; at most {lines} lines a node per window)", n=window.left_out, what=self._what,
                 node=node_id, window=self.window_s, lines=self.lines)
        window.summary = None
        window.left_out = 0
